"""Stack files: the single source of truth for versions, validated on load (rig.core.schema's
typed fields, read by rig.core.documents' strict YAML loader)."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from rig.core import RigError, defaults, numbers
from rig.core.cuda_releases import COMPONENTS, RELEASES
from rig.core.renames import Renamed
from rig.core.schema import Field, between, distribution, feature, once, sha256, version
from rig.core.schema import validate as validate_document

GRAPH_MAX = 4096  # the largest decode CUDA graph a stack may ask for (server.cuda_graph_max_bs)
KEY_ENV = "SGLANG_API_KEY"  # where a server's API key is read from unless the stack names another
METHODS = ("wheels", "apt", "runfile")
ARCHS = ("12.0a", "12.0", "10.0a", "10.0", "9.0a", "9.0")


def _cuda_version(value: str) -> str | None:
    if value not in RELEASES:
        return f"unknown CUDA version {value!r}; known: {', '.join(RELEASES)}"
    return None


def _sha256(value: str) -> str | None:
    return None if not value or not sha256(value) else "must be 64 lowercase hex digits"


def _python(value: str) -> str | None:
    return None if re.fullmatch(r"3\.\d+", value) else f"{value!r} is not a Python version like 3.12"


def _source(value: dict) -> str | None:
    """A source build: a git URL and ref, or a local source dir/tarball for air-gapped builders."""
    git, path = value.get("git"), value.get("path")
    if not git and not path:  # no source build; a validated stack has the keys, empty
        return "give either git (with ref) or path" if any(value.values()) else None
    if git and path:
        return "give either git (with ref) or path, not both"
    if git and not value.get("ref"):
        return "a git source needs a ref (tag or commit)"
    return None


def _required_source(value: dict) -> str | None:
    return _source(value) or (None if value.get("git") or value.get("path") else "give either git (with ref) or path")


def _fraction(value: float) -> str | None:
    return None if 0 <= value < 1 else "must be a fraction below 1 (0 leaves sglang's default)"


def _absolute(value: str) -> str | None:
    """An absolute path as written, never one the working directory decides ("venv", ".", "~", "$HOME/v"), with no
    control character or whitespace at either end (a path that reaches a unit or a command line)."""
    clean = value == value.strip() and not any(ord(c) < 32 or ord(c) == 127 for c in value)
    return None if value.startswith("/") and clean else "must be an absolute path (no control characters)"


def _host(value: str) -> str | None:
    return None if re.fullmatch(r"[A-Za-z0-9.:_-]{1,253}", value) else f"{value!r} is not a host name or address"


def _port(value: int) -> str | None:
    return None if 0 < value < 65536 else "must be a TCP port (1-65535)"


def env_name(value: str) -> str | None:
    return None if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value) else f"{value!r} is not an environment variable name"


def _requirement(value: str) -> str | None:
    """A requirement specifier (name, extras, version, markers), never a pip option or a URL: the stack's
    text reaches pip's command line."""
    from packaging.requirements import InvalidRequirement, Requirement

    if value.startswith("-"):
        return f"{value!r} is a pip option, not a package; give a requirement like name==1.2"
    try:
        req = Requirement(value)
    except InvalidRequirement as exc:
        return f"{value!r} is not a requirement specifier ({exc})"
    return f"{value!r} names a URL; packages come from the stack's indexes" if req.url else None


# the free-off patches' switches (RIG_FREE_OFF_CHECK: the free-off-check patch's), as their documentation spells
# them: any other value would be read as something the user did not mean (a switch read as on, a mode the patch
# does not have)
SWITCHES = {"RIG_FREE_OFF": ("0", "1"), "RIG_FREE_OFF_DRAFT": ("ingest", "extend"), "RIG_FREE_OFF_CHECK": ("0", "1")}
WHOLE = {"RIG_FREE_OFF_HOLD": 999_999}  # decode steps


def switch_problem(name: str, val: str) -> str | None:
    """Why VAL is no value of the free-off switch NAME (None: it is one, or NAME is no switch); a name of the
    switches' family that is none of them is a misspelling the patch would ignore."""
    if name.startswith("RIG_FREE_OFF") and name not in SWITCHES and name not in WHOLE:
        return (f"{name}: no free-off switch is called so (the patch would ignore it); give one of: "
                f"{', '.join([*SWITCHES, *WHOLE])}")
    if name in SWITCHES and val not in SWITCHES[name]:
        return f"{name}: {val[:40]!r} is not one of its values; give one of: {', '.join(SWITCHES[name])}"
    if name in WHOLE and not (re.fullmatch(r"[0-9]{1,6}", val) and int(val) <= WHOLE[name]):
        return f"{name}: {val[:40]!r} is not a whole number of 0 to {WHOLE[name]}"
    return None


def _env_vars(value: dict) -> str | None:
    for name, val in value.items():
        if not isinstance(name, str):  # YAML reads null, true, 1 or .inf as such, not as names
            return f"{name!r} is not an environment variable name (YAML read it as {type(name).__name__}; quote it)"
        if msg := env_name(name):
            return msg
        if isinstance(val, float):  # 1e-3 would reach the variable as 0.001, and 1e5 as 100000.0
            return f"{name}: {val!r} is a fraction as YAML reads it; quote it, so the variable holds what you wrote"
        if not isinstance(val, (str, int)) or isinstance(val, bool):
            return f"{name}: give a string or a whole number, not {type(val).__name__}"
        if isinstance(val, int) and (wrong := numbers.problem(val)):
            return f"{name}: {wrong}"
        if any(ord(c) < 32 for c in str(val)):
            return f"{name}: {str(val)[:40]!r} must be one line (no newline, tab or NUL): every start of the venv reads it"
        if msg := switch_problem(name, str(val)):
            return msg
    return None


def _package(name_choices: tuple, default_name: str) -> Field:
    """A pinned package: a prebuilt wheel of `version`, or a source build of it."""
    return Field(dict, default={}, fields={
        "package": Field(default=default_name, choices=name_choices),
        "version": Field(default="", check=lambda v: v and version(v)),
        "extras": Field(list, default=[], check=once, item=Field()),
        "source": Field(dict, default={}, check=_source, fields={
            "git": Field(default=""), "ref": Field(default=""), "path": Field(default=""),
            "subdirectory": Field(default=""),
        }),
    })


SCHEMA = {
    "name": Field(required=True, check=distribution),  # it names files, units and images: a plain name
    "description": Field(default="", multiline=True),
    # the target's interpreter and C library: which wheels can run there
    "python": Field(default="3.12", check=_python),
    # more Pythons the stack's hosts have (Ubuntu 22.04: 3.10, 24.04: 3.12): one more lock each, picked
    # by the host's python3 (rig lock writes STACK.pyXY.lock)
    "pythons": Field(list, default=[], item=Field(check=_python)),
    "glibc": Field(default="2.35", check=lambda v: None if re.fullmatch(r"2\.\d+", v) else "like 2.35"),
    "venv": Field(default=defaults.VENV, nonempty=True, check=_absolute),
    # index_url "" means the installer's configured default index (PyPI unless set);
    # ${VAR} is taken from the environment, for indexes and mirrors named per site.
    "torch": Field(dict, default={}, fields={
        "version": Field(default="", check=lambda v: v and version(v)),
        "index_url": Field(default=""),
    }),
    "sglang": _package(("sglang",), "sglang"),
    "kernel": _package(("sglang-kernel", "sgl-kernel"), "sglang-kernel"),
    "flashinfer": Field(dict, default={}, fields={
        **_package(("flashinfer-python",), "flashinfer-python").fields,
        "cubin": Field(bool, default=False),
        "jit_cache": Field(bool, default=False),
    }),
    "extra_packages": Field(list, default=[], item=Field(check=_requirement)),
    # torch extensions the site builds from source against the stack's torch (its own ops, a fork):
    # source builds that need no index entry, compiled by `rig wheels build` or an image's builder
    "extensions": Field(list, default=[], item=Field(dict, fields={
        "package": Field(required=True, check=distribution),
        "version": Field(required=True, check=version),
        "source": Field(dict, required=True, check=_required_source, fields={
            "git": Field(default=""), "ref": Field(default=""), "path": Field(default=""),
            "subdirectory": Field(default=""),
        }),
    })),
    "cuda": Field(dict, required=True, fields={
        "version": Field(required=True, check=_cuda_version),
        "method": Field(default="wheels", choices=METHODS),
        "components": Field(list, default=list(COMPONENTS), check=once, item=Field(choices=COMPONENTS)),
        "make_default": Field(bool, default=False),
        "apt": Field(dict, default={}, fields={
            "repo_url": Field(default=""),
            "keyring_url": Field(default=""),
            "package": Field(default=""),
        }),
        "runfile": Field(dict, default={}, fields={
            "url": Field(default=""),
            "sha256": Field(default="", check=_sha256),
        }),
    }),
    "archs": Field(list, default=["12.0a"], check=once, item=Field(choices=ARCHS)),
    # rig's opt-in source patches this stack asks for, by feature (free-off: adaptive step 0 as a plain decode;
    # free-off-check: RIG_FREE_OFF_CHECK's numerics check of it);
    # `rig patch apply --stack` and the sglang_patches role apply them, an apply without one takes it out
    "patches": Field(dict, default={}, fields={
        "opt_in": Field(list, default=[], check=once, item=Field(check=feature)),
    }),
    # --- what the venv's processes see and how the server runs; not part of the lock
    "environment": Field(dict, default={}, fields={
        "nccl_pcie_only": Field(bool, default=False),   # boxes whose GPUs talk over PCIe only
        "vars": Field(dict, default={}, check=_env_vars),
    }),
    "server": Field(dict, default={}, fields={
        # "testmodel": the generated tiny target and draft under testmodel_dir (rig testmodel)
        "model": Field(default=""),
        "draft_model": Field(default=""),            # EAGLE-3 draft; "" serves without speculation
        "testmodel_dir": Field(default=defaults.TESTMODEL_DIR, check=_absolute),
        # the generated model's shape (tiny proves the path; 1b and 8b cost what a real model's step costs) and the
        # probability its target gives the draft's token at temperature 1 (rig testmodel --shape, --accept)
        "testmodel_shape": Field(default="tiny", choices=("tiny", "1b", "8b")),
        "testmodel_accept": Field((int, float), default=1.0, check=lambda v: None if 0.001 <= v <= 1 else
                                  "must be a probability from 0.001 to 1"),
        "speculative_num_steps": Field(int, default=2, check=between(1, 32)),
        "speculative_eagle_topk": Field(int, default=4, check=between(1, 64)),
        "speculative_num_draft_tokens": Field(int, default=8, check=between(1, 1024)),
        "tp": Field(int, default=1, check=between(1, 64)),
        "mem_fraction_static": Field((int, float), default=0, check=_fraction),  # 0: sglang's default
        # 0: SGLang's own; rig tune measures with the largest level it measures at (and proposes that)
        "cuda_graph_max_bs": Field(int, default=0, check=between(0, GRAPH_MAX)),
        # 0 leaves SGLang's own: under speculation it sets 48 when unset, below a large decode graph
        "max_running_requests": Field(int, default=0, check=between(0, numbers.MAX_RUNNING_REQUESTS)),
        # the first is served (none: SGLang's default); rig tune measures each (triton, fa3, flashinfer, ...)
        "attention_backends": Field(list, default=[], check=once, item=Field(check=lambda v: None if re.fullmatch(
            r"[a-z0-9_]{1,40}", v) else f"{v!r} is not an attention backend name like triton or fa3")),
        "flashinfer_allreduce_fusion": Field(bool, default=False),
        "torch_symm_mem": Field(bool, default=False),
        "host": Field(default="127.0.0.1", check=_host),
        "port": Field(int, default=30000, check=_port),
        "api_key_env": Field(default=KEY_ENV, check=env_name),
        # SGLang's load-aware speculation (0.5.17+): the JSON config `rig tune` writes, on the server's host;
        # "" serves fixed speculation
        "speculative_adaptive_config": Field(default="", check=lambda v: v and _absolute(v)),
        "extra_args": Field(list, default=[], item=Field()),
        # seconds a started server has to answer its health: systemd's gate on a host, rig tune's and rig prove's
        # wait for each server they start (a big model loads in about 10 minutes)
        "start_timeout": Field(int, default=1200, check=between(61, 7 * 86400)),
    }),
    # what `rig bench`, `rig tune` and `rig prove` measure: the one place for the plan's defaults and limits
    # (rig.serving.measure.plan checks the options against these same fields)
    "bench": Field(dict, default={}, fields={
        "concurrency": Field(list, default=[1, 2, 5, 10, 30, 70, 100, 250], check=lambda v: once(v) if v else
                             "give at least one level", item=Field(int, check=between(1, 100_000))),
        "max_tokens": Field(int, default=512, check=between(1, 1_000_000)),
        "serial_runs": Field(int, default=10, check=between(1, 10_000)),
        "serial_tokens": Field(int, default=2048, check=between(1, 1_000_000)),
        "rounds": Field(int, default=3, check=between(1, 100)),  # each level's rounds, the servers interleaved
        "min_requests": Field(int, default=30, check=between(1, 100_000)),  # each round sends max(this, 2C)
        "warmup": Field(int, default=2, check=between(0, 1000)),  # requests before a server is measured
        # each level also runs at least this long: a count of short requests can be over in half a second
        "min_seconds": Field((int, float), default=0, check=between(0, 3600)),
        "read_timeout": Field((int, float), default=300, check=between(1, 86400)),  # silence that fails a request
        # however steadily a server streams, a request that takes longer than this has failed
        "request_timeout": Field((int, float), default=1800, check=between(1, 86400)),
        "slo_ttft_ms": Field((int, float), default=0, check=between(0, 3_600_000)),  # goodput SLOs (0: not set)
        "slo_tpot_ms": Field((int, float), default=0, check=between(0, 3_600_000)),
        "seed": Field(int, default=0, check=between(0, 2 ** 32 - 1)),  # Poisson arrivals, the prompt file's order
        # 0 is greedy: every draft of rig's agree test model is accepted. Sampling (1.0) accepts a draft token
        # with the target's probability of it, as with a trained draft
        "temperature": Field((int, float), default=0.0, check=between(0, 2)),
        "top_p": Field((int, float), default=1.0, check=lambda v: None if 0 < v <= 1 else "must be above 0, at most 1"),
    }),
    # `rig tune`: the variants it measures on the box and the load it measures them at (the bench section's
    # concurrency, max_tokens, rounds and min_seconds, plus open-loop request rates)
    "tune": Field(dict, default={}, fields={
        "steps": Field(list, default=[1, 2, 3], check=once, item=Field(int, check=between(1, 32))),
        # SGLang's adaptive step 0 measured as servers of their own: "step0" as SGLang ships it, "step0-skip-extend"
        # with SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND=1 (where the installed sglang reads it), "step0-plain" as rig's
        # free-off patch makes it (a plain decode; the stack's patches.opt_in lists free-off), "step0-plain-ingest"
        # the same with the draft kept in step by its KV alone (RIG_FREE_OFF_DRAFT=ingest)
        "step0": Field(list, default=[], check=once, item=Field(choices=("step0", "step0-skip-extend",
                                                                          "step0-plain", "step0-plain-ingest"))),
        # when a speculative server caps its running requests below its decode graph, measure it uncapped too
        "uncapped": Field(bool, default=True),
        # the levels (concurrencies) at which each server's full batch is profiled by SGLang's own torch profiler,
        # for that many decode steps: where a step's time goes, kernel by kernel (none: no profile)
        "profile_levels": Field(list, default=[], check=once, item=Field(int, check=between(1, 100_000))),
        "profile_steps": Field(int, default=20, check=between(1, 1000)),
        # the host's Python too (SGLang's CPU activity and its stacks): where the scheduler's time goes, function by
        # function; it slows the profiled steps, so their GPU idle share reads high
        "profile_host": Field(bool, default=False),
        "request_rates": Field(list, default=[], check=once, item=Field((int, float), check=between(0.001, 100_000))),
    }),
}
# Keys that moved (SECTION.KEY to SECTION.KEY), each still read at its old place, with a warning, until its release.
MOVED_KEYS = (
    Renamed("tune.start_timeout", "server.start_timeout", "0.2.0", "key"),  # one start timeout for every server
)
# Sections that shape processes (and the patches over the installed packages), not which packages: editing them
# leaves the lock current.
RUNTIME_KEYS = ("environment", "server", "bench", "tune", "patches")


def validate(data: Any, source: str = "<stack>") -> dict:
    """Return the stack with defaults filled in, or raise RigError naming the key."""
    if not isinstance(data, dict):
        raise RigError(f"{source}: a stack file must be a mapping of keys, got {type(data).__name__}")
    stack = validate_document(_moved(data, source), Field(dict, fields=SCHEMA), source)
    if problem := unmeasured_profiles(stack["tune"]["profile_levels"], stack["bench"]["concurrency"]):
        raise RigError(f"{source}: {problem}")
    return stack


def _moved(data: dict, source: str) -> dict:
    """DATA with each key of MOVED_KEYS taken from its old place to its new one (a copy: DATA is left as read),
    each one found said on stderr; both places given is refused, as two values for one setting."""
    for renamed in MOVED_KEYS:
        (old_section, old_key), (new_section, new_key) = renamed.old.split("."), renamed.new.split(".")
        old, new = data.get(old_section), data.get(new_section) or {}
        if not (isinstance(old, dict) and old_key in old and isinstance(new, dict)):
            continue  # nothing at the old place, or a section the schema refuses in its own words
        if new_key in new:
            raise RigError(f"{source}: {renamed.old} and {renamed.new} are one setting, given twice",
                           hint=f"keep {renamed.new} and remove {renamed.old}")
        renamed.warn(source)
        data = {**data, old_section: {k: v for k, v in old.items() if k != old_key},
                new_section: {**new, new_key: old[old_key]}}
    return data


def unmeasured_profiles(profile_levels: list[int], concurrency: list[int]) -> str | None:
    """A tune.profile_levels entry that no level of CONCURRENCY (bench.concurrency, or the options over it)
    measures: nothing would be profiled there."""
    if unmeasured := sorted(set(profile_levels) - set(concurrency)):
        return (f"tune.profile_levels lists {', '.join(map(str, unmeasured))}, a concurrency no level measures "
                f"(bench.concurrency: {', '.join(map(str, concurrency))}): profile measured levels only")
    return None


def load(path: str | Path) -> dict:
    from rig.core.documents import load_yaml

    return validate(load_yaml(path, "stack file"), str(path))


def pins_packages(stack: dict) -> bool:
    return bool(stack["extra_packages"] or stack["extensions"] or stack["torch"].get("version") or
                any(stack[k].get("version") for k in ("sglang", "kernel", "flashinfer")))
