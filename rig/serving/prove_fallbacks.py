"""rig prove's free-off fallback step: the requests a plain step 0 does not serve take SGLang's own verify path, and
every request a user may send comes out of a step-0 batch as it comes out of a drafting one.

The free-off patch serves a step-0 batch as a plain decode unless a request in it needs what only SGLang's verify
path does (its _rig_batch_refusal: a grammar, logprobs, penalties, ...); then the whole batch takes that path and
the server logs the reason (`rig free-off: step 0 took SGLang's verify path (REASON)`, at the 1st, 2nd, 4th, ...).
Stop strings and n > 1 stay on the plain path but change what the server hands back. On the numerics model's
switching server (prove_free_off.SLOTS, the routing unheld), each KIND is asked twice, greedy, on a numerics prompt:

1. alone: one request at a time, below the step-0 slot, so the server drafts (SGLang's EAGLE-3 verify);
2. mixed: one at a time again, each into a batch that FILLERS hold at step 0 (more running than the slot's edge,
   asking for many more tokens than the kinds do).

Each mixed answer must equal its drafted one (tokens, text, finish reason; logprobs within BF16_STEPS of bf16's
spacing at their size, the two paths running different kernels), the grammar's text must be an instance of SCHEMA,
and the log must name each reason the mix should have caused. Every request has a deadline: nothing hangs.
"""
from __future__ import annotations

import concurrent.futures
import math
import re
import time
from pathlib import Path
from typing import Any

from rig.core import RigError
from rig.core.check import Check, Runner
from rig.core.documents import dump_json, parse_json
from rig.serving import numerics
from rig.serving.sglang_api import call, server_info

FALLBACKS = "free-off: fallbacks"
RANKS = ["high", "low"]
SCHEMA = {"type": "object", "properties": {"rank": {"enum": RANKS}}, "required": ["rank"], "additionalProperties": False}
# KIND -> (sampling params, request fields, the reason the patch logs when it meets KIND at step 0, or None)
KINDS: dict[str, tuple[dict, dict, str | None]] = {
    "grammar": ({"json_schema": dump_json(SCHEMA, "the fallback schema")}, {}, "grammar"),
    "logprobs": ({}, {"return_logprob": True, "top_logprobs_num": 2}, "logprobs"),
    "penalties": ({"frequency_penalty": 0.5, "presence_penalty": 0.5}, {}, "penalties"),
    "stop": ({}, {}, None),  # its stop string is cut from its own drafted text (stop_string)
    "n": ({"n": 2}, {}, None),
}
TOKENS = numerics.NEW_TOKENS
FILLERS, FILLER_TOKENS = 8, 32 * numerics.NEW_TOKENS  # twice the step-0 slot's edge, running far past the kinds
SETTLE_S = 0.5  # the fillers' prefill, before the first kind joins them
BF16_STEPS = 2
DEADLINE_S = 120.0
SAID = re.compile(r"rig free-off: step 0 took SGLang's verify path \(([a-z ]{1,40})\)")


def reasons_seen(log: Path, offset: int) -> list[str]:
    """The fallback reasons the server logged past OFFSET bytes of LOG."""
    if not log.is_file():
        return []
    with log.open("rb") as f:
        f.seek(offset)
        return SAID.findall(f.read().decode(errors="replace"))


def log_size(log: Path) -> int:
    return log.stat().st_size if log.is_file() else 0


def grammar_backend(url: str, api_key_env: str) -> str | None:
    """The server's grammar backend as /server_info says it; None where it says none it knows of."""
    said = server_info(url, api_key_env).get("grammar_backend")
    return said if isinstance(said, str) and said else None


def body(kind: str, prompt: list[int], stop: str | None = None) -> dict:
    sampling, fields, _ = KINDS[kind]
    params = {"max_new_tokens": TOKENS, "temperature": 0.0, **sampling}
    if kind != "grammar":  # the grammar's own end is an end of sequence
        params["ignore_eos"] = True
    if stop is not None:
        params["stop"] = [stop]
    return {"input_ids": prompt, "sampling_params": params, **fields}


def generate(url: str, request: dict, api_key_env: str, what: str) -> list[dict]:
    """SGLang's /generate answer as a list of its outputs (n > 1 answers with a list)."""
    status, raw = call(url, "/generate", request, DEADLINE_S, api_key_env)
    if status != 200:
        raise RigError(f"{what}: HTTP {status or 'no answer'}: {raw[:300].decode(errors='replace')}")
    answer = parse_json(raw.decode(errors="surrogateescape"), what)
    outputs = answer if isinstance(answer, list) else [answer]
    if not outputs or not all(isinstance(o, dict) and isinstance(o.get("meta_info"), dict) for o in outputs):
        raise RigError(f"{what}: not SGLang's answer (an object with meta_info, or a list of them): {raw[:200]!r}")
    return outputs


def stop_string(text: str) -> str:
    """The three characters of a drafted text that first occur latest in it: a stop string the answer meets as
    far in as its text allows (a numerics text repeats, so any string first occurs within its first period; run 14
    stopped after one character with the middle's)."""
    first = {text.find(text[at:at + 3]): text[at:at + 3] for at in range(len(text) - 2)}
    if max(first, default=0) > 0:
        return first[max(first)]
    raise RigError(f"no stop string can be cut from the drafted text {text!r}: it is too short, or one character "
                   "repeated")


def bf16_close(a: Any, b: Any) -> bool:
    """A and B within BF16_STEPS of bf16's spacing at their size (8 bits of precision)."""
    if not all(isinstance(x, (int, float)) and math.isfinite(x) for x in (a, b)):
        return False
    size = max(abs(a), abs(b), 1.0)
    return abs(a - b) <= BF16_STEPS * 2.0 ** (math.floor(math.log2(size)) - 7)


def logprobs(output: dict) -> list[float]:
    """Each position's top-2 logprobs, flattened, from SGLang's output_top_logprobs ([[logprob, id, text], ...])."""
    tops = output["meta_info"].get("output_top_logprobs")
    if not isinstance(tops, list):
        return []
    return [entry[0] if isinstance(entry, list) and entry else math.nan for position in tops
            for entry in (position if isinstance(position, list) else [None])]


def differences(kind: str, alone: dict, mixed: list[dict], count: int) -> list[str]:
    """How the mixed answers differ from the drafted one (empty: they agree)."""
    found = []
    if len(mixed) != count:
        found.append(f"{len(mixed)} outputs where n = {count}")
    for i, output in enumerate(mixed):
        where = f"{kind}" + (f" (output {i + 1})" if count > 1 else "")
        for key in ("output_ids", "text"):
            if output.get(key) != alone.get(key):
                found.append(f"{where}: {key} {_shown(output.get(key))} where drafting gave {_shown(alone.get(key))}")
        if output["meta_info"].get("finish_reason") != alone["meta_info"].get("finish_reason"):
            found.append(f"{where}: finish_reason {output['meta_info'].get('finish_reason')} where drafting gave "
                         f"{alone['meta_info'].get('finish_reason')}")
    if kind == "logprobs":
        want, got = logprobs(alone), logprobs(mixed[0]) if mixed else []
        if not want or len(want) != len(got) or not all(map(bf16_close, want, got)):
            found.append(f"logprobs: {_shown(got)} where drafting gave {_shown(want)} (within {BF16_STEPS} bf16 "
                         "steps)")
    return found


def grammar_problem(output: dict) -> str | None:
    """Why the grammar's answer is not an instance of SCHEMA (None: it is)."""
    finish = output["meta_info"].get("finish_reason")
    if not isinstance(finish, dict) or finish.get("type") != "stop":
        return f"the grammar's answer did not end within {TOKENS} tokens (finish_reason {finish})"
    try:
        value = parse_json(str(output.get("text")), "the grammar's answer")
    except RigError:
        return f"the grammar's answer is not JSON: {_shown(output.get('text'))}"
    if not (isinstance(value, dict) and set(value) == {"rank"} and value["rank"] in RANKS):
        return f"the grammar's answer is JSON but not the schema's: {_shown(output.get('text'))}"
    return None


def _shown(value: Any, most: int = 120) -> str:
    text = dump_json(value, "an answer") if not isinstance(value, str) else repr(value)
    return text if len(text) <= most else text[:most] + "..."


def run_step(url: str, api_key_env: str, log: Path, report: Runner) -> None:
    """The step on the running switching server whose log is LOG; a grammar backend of `none` skips that kind."""
    backend = grammar_backend(url, api_key_env)
    kinds = list(KINDS)
    if backend in (None, "none"):  # unsaid is not "on": the grammar is not sent where it could not be followed
        kinds.remove("grammar")
        why = ("the server runs without a grammar backend (--grammar-backend none): serve the stack without it to "
               "prove a grammar at step 0") if backend else "the server's /server_info names no grammar backend"
        report.skip(f"{FALLBACKS}: grammar", why)
    report.run(FALLBACKS, lambda record: judge(*mix(url, api_key_env, log, kinds), record))


def mix(url: str, api_key_env: str, log: Path, kinds: list[str]) -> tuple[dict[str, dict], dict[str, list[dict]],
                                                                         list[str], list[str]]:
    """Each KIND alone (drafting), then each mixed into the fillers' step-0 batch: (alone, mixed, expected reasons,
    reasons logged during the mix)."""
    prompts = numerics.prompts()
    asked: dict[str, tuple[list[int], str | None]] = {kind: (prompts[i % len(prompts)], None)
                                                      for i, kind in enumerate(kinds)}
    alone: dict[str, dict] = {}
    for kind, (prompt, _) in asked.items():
        if kind == "stop":
            plain = generate(url, body("stop", prompt), api_key_env, "the stop kind's text")[0]
            asked[kind] = (prompt, stop_string(str(plain.get("text"))))
        alone[kind] = generate(url, body(kind, *asked[kind]), api_key_env, f"the {kind} kind, drafting")[0]
    offset, mixed = log_size(log), dict[str, list[dict]]()
    filler = {"sampling_params": {"max_new_tokens": FILLER_TOKENS, "temperature": 0.0, "ignore_eos": True}}
    with concurrent.futures.ThreadPoolExecutor(FILLERS) as pool:
        fillers = [pool.submit(generate, url, {"input_ids": prompts[i % len(prompts)], **filler}, api_key_env,
                               "a filler of the step-0 batch") for i in range(FILLERS)]
        time.sleep(SETTLE_S)
        for kind, (prompt, stop) in asked.items():
            if any(f.done() for f in fillers):
                raise RigError(f"the fillers ended before the {kind} kind was sent: the batch was no longer at "
                               f"step 0 (give the fillers more than {FILLER_TOKENS} tokens)")
            mixed[kind] = generate(url, body(kind, prompt, stop), api_key_env, f"the {kind} kind, at step 0")
        for f in fillers:
            f.result(timeout=DEADLINE_S)
    expected = [reason for kind in kinds if (reason := KINDS[kind][2])]
    return alone, mixed, expected, reasons_seen(log, offset)


def judge(alone: dict, mixed: dict, expected: list[str], seen: list[str], record: Check) -> None:
    problems = [d for kind in alone for d in differences(kind, alone[kind], mixed[kind], KINDS[kind][0].get("n", 1))]
    if "grammar" in mixed:
        problems += filter(None, [grammar_problem(o) for o in mixed["grammar"]])
    missing = [reason for reason in expected if reason not in seen]
    if missing:
        problems.append(f"the log names no fallback for {', '.join(missing)} (`rig free-off: step 0 took SGLang's "
                        f"verify path (REASON)`; seen: {', '.join(seen) or 'none'}): those requests were not served "
                        "in a step-0 batch, or the patch is not applied (rig patch status)")
    record.data = {"kinds": list(alone), "fallbacks_logged": seen,
                   "answers": {kind: {"alone": _brief(alone[kind]), "mixed": [_brief(o) for o in mixed[kind]]}
                               for kind in alone}}
    if problems:
        record.problems = problems
        raise RigError(f"{len(problems)} problem(s) with requests in a step-0 batch: {problems[0]}")
    record.detail = (f"{', '.join(alone)}: each the same from a step-0 batch as drafting; fallbacks logged: "
                     f"{', '.join(sorted(set(seen)))}")
    if "grammar" in mixed:
        record.detail += f"; the grammar gave {mixed['grammar'][0].get('text')!r}"


def _brief(output: dict) -> dict:
    meta = output["meta_info"]
    return {"output_ids": output.get("output_ids"), "text": output.get("text"),
            "finish_reason": meta.get("finish_reason"), "top_logprobs": logprobs(output)[:8] or None}
