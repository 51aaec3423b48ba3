"""A child rig keeps for many questions (sglang's argument parser): one JSON request a line on its stdin, one
JSON answer a line on a pipe of its own. Never its stdout: whatever the child imports may print there, and a
banner taken for an answer is a wrong answer. Each answer has a deadline and is held to a schema; an exchange
that goes wrong in any way (an overrun, a wrong answer, the child's end, an interrupt) ends the child, so that
no later question is answered with what was left of an earlier one."""
from __future__ import annotations

import contextlib
import os
import select
import tempfile
import time

from rig.core import RigError
from rig.core.documents import dump_json, parse_json
from rig.core.proc import PIPE, reap, spawn
from rig.core.schema import Field, validate

MAX_ANSWER = 16 << 20  # bytes: more than any answer of rig's own scripts, far less than memory


class Overrun(RigError):
    """The child gave no whole answer within its deadline."""


class Dialogue:
    """ARGV started with the answer pipe's descriptor as its last argument. WHAT names it in errors, WHERE says
    what it runs in, FIX says what the user does about a child that hangs or answers wrongly; DEADLINE is the
    seconds each answer may take (the first one includes the child's imports)."""

    def __init__(self, argv: list[str], what: str, where: str, fix: str, deadline: float):
        self.what, self.where, self.fix, self.deadline = what, where, fix, deadline
        # its stdout and stderr (a pipe no one reads would fill), read back as text whatever bytes it wrote
        self.errors = tempfile.TemporaryFile("w+", errors="replace")
        read, write = os.pipe()
        try:
            self.proc = spawn([*argv, str(write)], what, stdin=PIPE, stdout=self.errors, stderr=self.errors,
                              text=True, pass_fds=(write,))
        except BaseException:
            os.close(read)
            self.errors.close()
            raise
        finally:
            os.close(write)
        assert self.proc.stdin  # a pipe
        self.stdin, self.answers, self.pending, self.answered, self.asked = self.proc.stdin, read, b"", False, 0

    def ask(self, request: dict, spec: Field) -> dict:
        """REQUEST's answer, checked against SPEC, its absent optional keys left out."""
        self.asked += 1
        try:
            self.stdin.write(dump_json({**request, "seq": self.asked}, f"a request to {self.what}") + "\n")
            self.stdin.flush()
            line = self._line()
            if line is not None:
                answer = self._in_turn(parse_json(line.decode("utf-8", "replace"), f"{self.what}'s answer"))
                answer = validate(answer, spec, f"{self.what}'s answer")
                self.answered = True
                return {k: v for k, v in answer.items() if v is not None}
        except OSError:  # it ended before it read the request
            pass
        except Overrun:
            last = self.close(kill=True)
            raise Overrun(f"{self.what} gave no answer within {self.deadline:.0f} s in {self.where} "
                          f"({last or 'it printed nothing'}); {self.fix}") from None
        except RigError as exc:
            self.close(kill=True)
            raise RigError(f"{exc}; {self.fix}") from exc
        except BaseException:
            self.close(kill=True)
            raise
        last = self.close(kill=True)
        raise RigError(f"{self.what} {'stopped' if self.answered else 'did not load'} in {self.where}: "
                       f"{last or 'it printed nothing'}")

    def _in_turn(self, answer: object) -> dict:
        """ANSWER, less its "seq", when it answers the request just asked: a second line written to one request would
        otherwise be taken for the next one's answer."""
        seq = answer.pop("seq", None) if isinstance(answer, dict) else None
        if seq != self.asked or isinstance(seq, bool):
            raise RigError(f"{self.what}'s answer: not to request {self.asked} (it says seq {seq!r}), an answer out "
                           "of turn")
        assert isinstance(answer, dict)
        return answer

    def _line(self) -> bytes | None:
        """The next answer line, or None where the child closed its end; Overrun past the deadline."""
        deadline = time.monotonic() + self.deadline
        while (end := self.pending.find(b"\n")) < 0:
            if len(self.pending) > MAX_ANSWER:
                raise RigError(f"{self.what}'s answer: more than {MAX_ANSWER} bytes without a line's end")
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.answers], [], [], left)[0]:
                raise Overrun(self.what)
            chunk = os.read(self.answers, 1 << 16)
            if not chunk:
                return None
            self.pending += chunk
        line, self.pending = self.pending[:end], self.pending[end + 1:]
        return line

    def close(self, kill: bool = False) -> str:
        """Its input closed (it exits at the end of it), or KILL; reaped (killed after 10 s). The last line it
        printed."""
        if self.errors.closed:  # closed already
            return ""
        if kill:
            self.proc.kill()
        with contextlib.suppress(OSError):  # one that died has its pipe broken
            self.stdin.close()
        reap(self.proc)
        os.close(self.answers)
        try:
            self.errors.seek(0)
            lines = self.errors.read().strip().splitlines()
        finally:  # closed whatever the read met: a second close() then returns at once
            self.errors.close()
        return lines[-1] if lines else ""
