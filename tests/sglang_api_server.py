"""A TEST STAND-IN for an SGLang server: it speaks SGLang's HTTP API, generates no text.

No SGLang server can run where rig's tests run (no GPU, no weights), so `rig smoke`
and `rig bench` are tested end to end against this. Endpoints, fields and status
codes are taken from SGLang's own source (sglang/srt/entrypoints/http_server.py and
managers/tokenizer_manager.py, 0.5.9 and 0.5.23):

- GET /health and /health_generate: 503 while the server is starting, then 200.
- POST /generate {"text", "sampling_params": {"max_new_tokens", "ignore_eos", ...},
  "stream"}: {"text", "output_ids", "meta_info"}; meta_info has id, finish_reason
  (None until done, then {"type": "length", "length": N}), prompt_tokens,
  completion_tokens, cached_tokens, and once finished e2e_latency and, under
  speculation, spec_verify_ct and spec_accept_length (completion_tokens /
  spec_verify_ct). Streaming sends `data: {json}\\n\\n` per decode step with the
  cumulative output, then `data: [DONE]\\n\\n`.
- GET /server_info (and the older /get_server_info): the server's arguments
  (speculative_algorithm ...) and internal_states[i].avg_spec_accept_length.
- POST /flush_cache: 400 while requests run; otherwise resets the acceptance counters.
- /server_info carries context_length and the scheduler's max_req_input_len (context - 1).
  A request whose prompt and max_new_tokens exceed the context length is refused as
  tokenizer_manager.py words it; without streaming as HTTP 400 {"error": {"message"}},
  with streaming as HTTP 200 and one chunk {"error": {"message", "type":
  "invalid_request_error", "code": 400, "retryable": false}} then [DONE]
  (http_server.py, _create_error_response, as SGLang 0.5.17 does).
- With an API key, requests without `Authorization: Bearer KEY` get 401.
- SIGTERM drains, as tokenizer_manager.py's SignalHandler and sigterm_watchdog do: the
  health endpoints answer 503 from then on, the requests in flight finish, then the
  process exits.

What is simulated, and configurable: the single-stream token rate, a total
capacity shared by the running requests (per-request speed falls under load),
the accept length (tokens per verify step under speculation), and faults:
503 for the first seconds, dying mid-stream after N requests, and a malformed
chunk in every Kth request, a server that never ends a request (--stream-forever: a chunk every 0.2 s past
max_new_tokens when streaming, no answer at all otherwise), and a completion that is not UTF-8 (--bad-text: its
final text ends in bytes no UTF-8 decoder takes, or in a lone surrogate escaped in the JSON, as a broken encoder
or proxy would send; SGLang's own orjson answers never do). GET /rig_test/stats (not SGLang's; the benchmark's
own check) reports the tokens generated and when. A request whose body has "rig_test": {"hold_until_drain":
true} (not SGLang's either) streams its first step, then waits until the server drains (SIGTERM), then goes on:
the tests' way to have a request in flight when a drain begins, however loaded the machine.

POST /start_profile {"output_dir", "num_steps", "profile_id"} (SGLang's ProfileReqInput) records the next
num_steps steps of the batched scheduler (POST /stop_profile ends it sooner; with none running it is an error, as
SGLang's scheduler answers) and writes `{output_dir}/{profile_id}-TP-0.trace.json.gz`, a Chrome trace whose kernel
events ("ph": "X", "cat": "kernel", "ts" and "dur" in microseconds) are the cost model's parts:
step_overhead, target_forward (token_ms x batch x (steps + 1)), draft_steps, draft_extend, each with the host's
cudaLaunchKernel ("cat": "cuda_runtime"). With "activities" listing "CPU", each step is also the host's Python, as
SGLang's profiler records it with stacks ("cat": "python_function"): the scheduler's run_batch around the step, the
launches inside it. The kernel and function names are the stand-in's own; the endpoint, the file's name and its
event format are SGLang's (torch profiler traces).

With --rule (the launcher passes a numerics test model's testmodel.json), a request given
`input_ids` gets the tokens that model's rule table makes (the numerics target's greedy
tokens) and, with return_logprob and top_logprobs_num, meta_info.output_top_logprobs as
SGLang words it (per token a list of [logprob, token_id, text]); --numerics-fault makes
them wrong as a broken kernel would.

A batched scheduler instead, with --step-ms: one decode step at a time for every running request, each
step costing step_ms + token_ms x batch x (steps + 1) and, under speculation, verify_ms x batch for
running the target as a verify (TARGET_VERIFY) rather than a decode, draft_ms x steps for the draft's
steps plus extend_ms x batch for the draft-extend pass over every request's accepted tokens (so drafting
more costs more, and step 0 is no free "off": SGLang's EAGLE worker runs a 1-node verify and the extend
after it, eagle_worker_v2.py). --free-off is step 0 as rig's free-off patch makes it: a plain decode with
no verify cost, the draft extend kept (the patch's extend sync, rig tune's step0-plain). The step-0 costs
measured on the H200 (issue 55: SGLang's step 0 at 0.35-0.50 of the baseline, the skipped extend buying
4-8 %) are what verify_ms and extend_ms stand for; tests choose them. Each position of a draft is
accepted at --accept-rate (the expected count, spread evenly over steps) when the request is greedy;
SGLang's acceptance under sampling is the target's probability of the draft token, so a request at
temperature t accepts each position at accept-rate x p_t, where p_t is what a target whose draft token
has probability --sampled-accept at temperature 1 beside 1000 tokens at logit 0 gives it at t (1 when
greedy, falling with t; rig testmodel --accept builds such a target). As SGLang's scheduler does, at most
max_running_requests run at once (--max-running-requests; when not given, 48 under speculation, SGLang's
spec hook, and 2048 without: a KV-limited figure), the rest wait; /server_info reports it. The steps come
from --steps, or from SGLang's adaptive config (--adaptive-config, as
sglang/srt/speculative/adaptive_spec_params.py reads it: integer-string keys are batch sizes, each
{"candidate_steps"}; the running batch is padded up to the next CUDA-graph size (--cuda-graph-bs) and
routed to the largest key at or below it, else the smallest; per slot an EMA of accepted drafts
(ema_alpha, warmup_batches, update_interval, up/down_hysteresis) moves between candidates, a step-0 slot
probing the next candidate after each interval). /rig_test/stats then also counts steps by their step
count and the slots' step switches.
With --free-off and an adaptive config the routing is rig's free-off patch's (eagle_worker_v2.py, _rig_activate):
the slot of the largest batch of the last --free-off-hold steps (RIG_FREE_OFF_HOLD; 0: SGLang's routing), each
switch counted and logged at the 1st, 2nd, 4th, ... as the patch words it (`rig free-off: steps A -> B at batch N
(routed as R); K switch(es) so far`). --numerics-fault after-switch and --stale-draft are the faults rig prove's
free-off steps must catch: tokens that differ, or a draft that accepts less, once drafting resumed after step 0.
The patch serves a step-0 batch on SGLang's verify path instead where a request in it needs that path
(_rig_batch_refusal: a grammar, then logprobs, then penalties), and logs the first reason that holds at the 1st,
2nd, 4th, ... such batch (`rig free-off: step 0 took SGLang's verify path (REASON); K batch(es) so far`); so does
the stand-in, and --fallback-fault shifts the logprobs of a request served in such a batch (a verify path that
reads the wrong logits). What SGLang's sampling params change in an answer, as tokenizer_manager.py and
schedule_batch.py make it: a json_schema (--grammar-backend other than none; /server_info says which) ends the
answer, once the grammar completes, in the schema's smallest instance (each required property's first enum
value) with finish_reason {"type": "stop", "matched": EOS}; a stop string cuts the text before its first match and
the tokens at the one that completed it, finish_reason {"type": "stop", "matched": STRING}; n > 1 answers a
list of n outputs (not streamed). The stand-in's text is "tok " a token.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import json
import os
import signal
import time

from aiohttp import web

RATE = 100.0  # tokens/s of one stream, unless --rate says otherwise (tests/serving_boxes.py paces by it)


class Slot:
    """One batch-size slot of SGLang's adaptive speculation: its candidates and the EMA that moves between them."""

    def __init__(self, candidates: list[int], knobs: dict, initial: int):
        self.candidates = sorted(set(candidates))
        self.alpha = knobs.get("ema_alpha", 0.2)
        self.interval = knobs.get("update_interval", 5)
        self.warmup = knobs.get("warmup_batches", 10)
        self.down = knobs.get("down_hysteresis", -0.25)
        self.up = knobs.get("up_hysteresis", 0.0)
        self.steps = initial if initial in self.candidates else self.candidates[len(self.candidates) // 2]
        self.ema = float(self.steps - 1)
        self.batches = 0

    def observe(self, accepted: list[int]) -> bool:
        """Feed one verify batch's accepted drafts; True when the slot switched its steps."""
        if self.steps > 0:
            self.ema += self.alpha * (sum(accepted) / len(accepted) - self.ema)
        self.batches += 1
        past = self.batches - self.warmup
        if past <= 0 or past % self.interval:
            return False
        at = self.candidates.index(self.steps)
        if self.steps == 0:  # after a nospec interval, probe the next candidate up
            at = min(at + 1, len(self.candidates) - 1)
            if self.candidates[at] > 0 and self.ema < 0:
                self.ema = float(self.candidates[at] - 1)
        else:
            lower = at
            while lower > 0 and self.ema <= self.down + (
                    0.5 if self.candidates[lower - 1] == 0 else self.candidates[lower - 1] - 0.5):
                lower -= 1
            if lower < at:
                at = lower
            else:  # nothing pulled it down: may it go up?
                while at < len(self.candidates) - 1 and self.ema > self.candidates[at] - 0.5 + self.up:
                    at += 1
        switched = self.candidates[at] != self.steps
        self.steps = self.candidates[at]
        return switched


class Adaptive:
    """The slots of an adaptive config, and SGLang's routing of a running batch size to one of them."""

    def __init__(self, path: str, graph_sizes: list[int], initial: int):
        config = json.loads(open(path).read())
        knobs = {k: v for k, v in config.items() if not k.isdigit()}
        self.slots = {int(k): Slot(v["candidate_steps"], {**knobs, **v}, initial)
                      for k, v in config.items() if k.isdigit()}
        self.graph_sizes = sorted(graph_sizes)
        self.switches = 0

    def slot(self, batch: int) -> Slot:
        padded = next((g for g in self.graph_sizes if g >= batch), batch)
        keys = [k for k in sorted(self.slots) if k <= padded]
        return self.slots[keys[-1] if keys else min(self.slots)]


class Simulator:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.started = time.monotonic()
        self.active = 0
        self.requests = itertools.count(1)
        self.tokens = 0
        self.first_emit = self.last_emit = None
        self.verify_steps = self.spec_tokens = 0
        self.gracefully_exit = False
        self.adaptive = Adaptive(args.adaptive_config, [int(g) for g in args.cuda_graph_bs.split(",")], args.steps) \
            if args.adaptive_config else None
        self.members: dict[int, dict] = {}
        self.joined = asyncio.Event()
        self.cap = args.max_running_requests or (48 if self.speculative_flags(args) else 2048)
        self.steps_run: dict[int, int] = {}
        self.rule = json.loads(open(args.rule).read())["spec"]["rule"] if args.rule else None
        self.profiling: dict | None = None
        # rig's free-off patch (eagle_worker_v2.py, _rig_activate): the slot of the largest batch of the last
        # --free-off-hold steps, and each switch counted and logged at the 1st, 2nd, 4th, ... as the patch logs it
        held = args.free_off and self.adaptive and args.free_off_hold
        self.held: collections.deque | None = collections.deque(maxlen=args.free_off_hold) if held else None
        self.steps_now, self.free_off_switches, self.resumed = args.steps, 0, False
        self.fallbacks: dict[str, int] = {}

    @staticmethod
    def speculative_flags(args: argparse.Namespace) -> bool:
        return args.accept_length > 0 or args.steps > 0 or bool(args.adaptive_config)

    @property
    def speculative(self) -> bool:
        return self.speculative_flags(self.args)

    def acceptance(self, temperature: float) -> float:
        """Each drafted position's acceptance at TEMPERATURE (the module docstring)."""
        if temperature <= 0:
            return self.args.accept_rate
        p, others = self.args.sampled_accept, 1000
        if p >= 1 or p <= 0:
            return self.args.accept_rate if p >= 1 else 0.0
        return self.args.accept_rate / (1 + others ** (1 - 1 / temperature) * ((1 - p) / p) ** (1 / temperature))

    async def schedule(self) -> None:
        """The batched scheduler (--step-ms): one step for every running request at a time."""
        a = self.args
        while True:
            if not self.members:
                self.joined.clear()
                await self.joined.wait()
            batch = list(self.members.values())[:self.cap]  # the rest wait, as SGLang's scheduler keeps them
            routed = len(batch)
            if self.held is not None:
                self.held.append(routed)
                routed = max(self.held)
            slot = self.adaptive.slot(routed) if self.adaptive else None
            steps = slot.steps if slot else a.steps
            if a.free_off and self.adaptive and steps != self.steps_now:
                self.switched(steps, len(batch), routed)
            if a.free_off and steps == 0:
                self.fell_back(batch)
            await asyncio.sleep(sum(self.parts(len(batch), steps).values()) / 1000)
            if self.profiling:
                self.profiled(len(batch), steps)
            self.steps_run[steps] = self.steps_run.get(steps, 0) + 1
            accepted = []
            for member in batch:
                member["owed"] += sum(self.acceptance_now(member["rate"]) ** j for j in range(1, steps + 1))
                accepted.append(int(member["owed"]))
                member["owed"] -= accepted[-1]
                member["queue"].put_nowait(1 + accepted[-1])
            if slot and slot.observe(accepted):
                self.adaptive.switches += 1

    def switched(self, steps: int, batch: int, routed: int) -> None:
        self.free_off_switches += 1
        count, before, self.steps_now = self.free_off_switches, self.steps_now, steps
        self.resumed = self.resumed or (before == 0 < steps)
        if count & (count - 1) == 0:
            print(f"rig free-off: steps {before} -> {steps} at batch {batch} (routed as {routed}); {count} switch(es) "
                  "so far", flush=True)

    def fell_back(self, batch: list[dict]) -> None:
        """A step-0 batch with a request that needs SGLang's verify path: counted, logged as the patch logs it."""
        needs = {member["needs"] for member in batch}
        reason = next((r for r in FALLBACK_ORDER if r in needs), None)
        if reason is None:
            return
        for member in batch:
            member["served"]["step0_fallback"] = True
        count = self.fallbacks[reason] = self.fallbacks.get(reason, 0) + 1
        if count & (count - 1) == 0:
            print(f"rig free-off: step 0 took SGLang's verify path ({reason}); {count} batch(es) so far", flush=True)

    def acceptance_now(self, rate: float) -> float:
        """--stale-draft: once drafting resumed after step 0, each position is accepted half as often (a draft whose
        KV step 0 left wrong)."""
        return rate / 2 if self.args.stale_draft and self.resumed else rate

    def parts(self, batch: int, steps: int) -> dict[str, float]:
        """One step's costs in ms by part (the cost model; the profiler's kernels): under speculation the target
        runs as a verify (--verify-ms a request over a decode) and the draft extends every request, step 0 too,
        unless --free-off runs step 0 as a plain decode (the draft extend stays: the patch's extend sync)."""
        a = self.args
        found = {"step_overhead": a.step_ms, "target_forward": a.token_ms * batch * (steps + 1)}
        if self.speculative:
            plain = steps == 0 and a.free_off
            found.update(target_verify=0.0 if plain else a.verify_ms * batch, draft_steps=a.draft_ms * steps,
                         draft_extend=a.extend_ms * batch)
        return found

    def profiled(self, batch: int, steps: int) -> None:
        """One step's parts as kernel events; the trace written once the asked number of steps is in."""
        profile = self.profiling
        parts = self.parts(batch, steps)
        # Kineto's microseconds since the epoch: the parts back to back over the step just slept, so what lies
        # between steps is the GPU idle
        at = time.time() * 1e6 - sum(parts.values()) * 1000
        if profile["cpu"]:
            profile["events"].append({"ph": "X", "cat": "python_function", "name": "stand_in/scheduler.py(1): run_batch",
                                      "ts": at - 10, "dur": sum(parts.values()) * 1000, "pid": 1, "tid": 1})
        for name, ms in parts.items():
            if ms:  # each kernel with the host's launch of it (Kineto's cuda_runtime event), 5 us on the host thread
                profile["events"] += [{"ph": "X", "cat": "kernel", "name": name, "ts": at, "dur": ms * 1000,
                                       "pid": 0, "tid": 7},
                                      {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": at - 5,
                                       "dur": 5, "pid": 1, "tid": 1}]
                at += ms * 1000
        profile["left"] -= 1
        if profile["left"] <= 0:
            self.write_profile()

    def write_profile(self) -> None:
        """The trace of the steps recorded, as SGLang writes it when they are all in or when asked to stop."""
        import gzip

        profile, self.profiling = self.profiling, None
        path = os.path.join(profile["dir"], f"{profile['id']}-TP-0.trace.json.gz")
        with gzip.open(path, "wt") as out:
            json.dump({"traceEvents": profile["events"]}, out)

    async def batched_steps(self, number: int, max_tokens: int, temperature: float, needs: str | None = None,
                            served: dict | None = None):
        """Tokens per step of one request as the batched scheduler hands them out; NEEDS: the reason it sends a
        free-off step-0 batch down SGLang's verify path, SERVED["step0_fallback"] set once it was in one."""
        queue: asyncio.Queue = asyncio.Queue()
        self.members[number] = {"queue": queue, "rate": self.acceptance(temperature), "owed": 0.0, "needs": needs,
                                "served": served if served is not None else {}}
        self.joined.set()
        done = 0
        try:
            while done < max_tokens:
                step = min(await queue.get(), max_tokens - done)
                done += step
                yield step
        finally:
            del self.members[number]

    def speed(self) -> float:
        """Tokens/s of one request now: the single-stream rate, or its share of the capacity."""
        share = self.args.capacity / max(self.active, 1) if self.args.capacity else self.args.rate
        return min(self.args.rate, share)

    def emitted(self, n: int) -> None:
        now = time.monotonic()
        self.first_emit = self.first_emit or now
        self.last_emit = now
        self.tokens += n


def _authorized(request: web.Request) -> bool:
    key = request.app["sim"].args.api_key
    return not key or request.headers.get("Authorization") == f"Bearer {key}"


async def health(request: web.Request) -> web.Response:
    sim = request.app["sim"]
    starting = time.monotonic() - sim.started < sim.args.start_delay
    return web.Response(status=503 if starting or sim.gracefully_exit else 200)


async def server_info(request: web.Request) -> web.Response:
    sim = request.app["sim"]
    spec = sim.speculative
    average = sim.spec_tokens / sim.verify_steps if sim.verify_steps else 0.0
    return web.json_response({
        "model_path": "test-stand-in", "tp_size": 1, "version": "stand-in",
        "speculative_algorithm": "EAGLE3" if spec else None,
        "speculative_num_steps": sim.args.steps or None, "speculative_adaptive": sim.adaptive is not None,
        "cuda_graph_bs": [int(g) for g in sim.args.cuda_graph_bs.split(",")], "max_running_requests": sim.cap,
        "grammar_backend": sim.args.grammar_backend,
        **({} if sim.args.hide_context else {"context_length": sim.args.context_length,
                                                "max_req_input_len": sim.args.context_length - 1}),
        "internal_states": [{"avg_spec_accept_length": average}] if spec else [{}],
    })


async def start_profile(request: web.Request) -> web.Response:
    sim = request.app["sim"]
    body = await request.json()
    sim.profiling = {"dir": body.get("output_dir") or "/tmp", "left": int(body.get("num_steps") or 5),
                     "id": body.get("profile_id") or str(time.time()), "events": [],
                     "cpu": "CPU" in (body.get("activities") or [])}
    return web.Response(text="Start profiling.\n")


async def stop_profile(request: web.Request) -> web.Response:
    """SGLang's /stop_profile: the trace written now; with no profile running its scheduler refuses (an error)."""
    sim = request.app["sim"]
    if not sim.profiling:
        return web.Response(status=500, text="Profiling is not in progress.\n")
    sim.write_profile()
    return web.Response(text="Stop profiling. This will take some time.\n")


async def flush_cache(request: web.Request) -> web.Response:
    sim = request.app["sim"]
    if sim.active:
        return web.Response(status=400, text="Flush cache failed: requests are running.\n")
    sim.verify_steps = sim.spec_tokens = 0
    return web.Response(text="Cache flushed.\n")


async def stats(request: web.Request) -> web.Response:
    sim = request.app["sim"]
    if request.method == "POST":
        sim.tokens, sim.first_emit, sim.last_emit = 0, None, None
    return web.json_response({"tokens": sim.tokens, "first_emit": sim.first_emit, "last_emit": sim.last_emit,
                              "steps_run": sim.steps_run,
                              "step_switches": sim.adaptive.switches if sim.adaptive else 0})


def _steps(max_tokens: int, accept_length: float):
    """Tokens per decode step: 1, or the accept length on average under speculation."""
    done, owed = 0, 0.0
    while done < max_tokens:
        owed += accept_length if accept_length > 0 else 1
        step = min(int(owed), max_tokens - done)
        owed -= step
        done += step
        yield step


def rule_tokens(sim: "Simulator", prompt: list, count: int) -> tuple[list[int], list]:
    """What the numerics target generates greedily (its rule table, read from the model's testmodel.json), with
    SGLang's output_top_logprobs per token ([logprob, token id, text]); the faults stand for wrong kernels."""
    rule = sim.rule
    ids = rule["ids"]
    ranks = [ids.index(t) + 1 for t in prompt if t in ids]
    current, highest = ranks[-1], max(ranks)
    tokens, tops = [], []
    for i in range(count):
        current = rule["next"][highest - 1][current - 1]
        token = ids[current - 1]
        fault = sim.args.numerics_fault
        if (fault == "wrong" and i % 5 == 3) or (fault == "speculative" and sim.speculative and i >= 5) or (
                fault == "after-switch" and sim.resumed and i >= 40):
            token = ids[current % len(ids)]
        if fault == "garbage":
            tokens.append(0)
            tops.append([[None, 0, None], [None, 1, None]])
            continue
        tokens.append(token)
        tops.append([[-1e-6, token, None], [-8.0, rule["decoys"][0], None]])  # the design's margin: 8 logits
    return tokens, tops


async def generate(request: web.Request) -> web.StreamResponse:
    sim: Simulator = request.app["sim"]
    if not _authorized(request):
        return web.json_response({"error": "Unauthorized"}, status=401)
    body = await request.json()
    params = body.get("sampling_params") or {}
    max_tokens = int(params.get("max_new_tokens", 128))
    number = next(sim.requests)
    input_ids = body.get("input_ids") if isinstance(body.get("input_ids"), list) else None
    prompt_tokens = len(input_ids) if input_ids is not None else len(str(body.get("text", "")).split())
    output_ids: list[int] = []
    meta = {"id": f"req-{number}", "finish_reason": None, "prompt_tokens": prompt_tokens,
            "completion_tokens": 0, "cached_tokens": 0}
    verify = 0
    begin = time.monotonic()
    stream = None
    if body.get("stream"):
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await stream.prepare(request)
    if prompt_tokens + max_tokens > sim.args.context_length:
        message = (f"Requested token count exceeds the model's maximum context length of {sim.args.context_length} "
                   f"tokens. You requested a total of {prompt_tokens + max_tokens} tokens: {prompt_tokens} tokens "
                   f"from the input messages and {max_tokens} tokens for the completion. Please reduce the number "
                   "of tokens in the input messages or the completion to fit within the limit.")
        if stream is None:
            return web.json_response({"error": {"message": message}}, status=400)
        error = {"message": message, "type": "invalid_request_error", "code": 400, "retryable": False}
        await stream.write(b"data: " + json.dumps({"error": error}).encode() + b"\n\n")
        await stream.write(b"data: [DONE]\n\n")
        await stream.write_eof()
        return stream
    if sim.args.stream_forever:
        await _forever(stream, meta)
    hold = bool((body.get("rig_test") or {}).get("hold_until_drain"))
    sim.active += 1
    batched = sim.args.step_ms > 0
    temperature = float(params.get("temperature", 1.0))  # SGLang's default when a request gives none
    grammar = _smallest_instance(params.get("json_schema")) if sim.args.grammar_backend != "none" else None
    if grammar is not None:  # the grammar completes, then its end of sequence
        max_tokens = min(max_tokens, len(grammar) + 1)
    served: dict = {"step0_fallback": False}
    steps = (sim.batched_steps(number, max_tokens, temperature, _fallback_reason(body, params, grammar), served)
             if batched else _paced(sim, max_tokens))
    try:
        i = -1
        async for step in steps:
            i += 1
            output_ids.extend(range(len(output_ids), len(output_ids) + step))
            verify += 1
            sim.emitted(step)
            meta["completion_tokens"] = len(output_ids)
            if sim.args.die_after and number >= sim.args.die_after and i == 1:
                os._exit(3)  # the process dies mid-stream, as a crashed server would
            if stream is None:
                continue
            if sim.args.malformed_every and number % sim.args.malformed_every == 0 and i == 1:
                await stream.write(b'data: {"text": "trunc\n\n')
            if len(output_ids) < max_tokens:
                await stream.write(b"data: " + json.dumps(
                    {"text": "tok " * len(output_ids), "output_ids": output_ids, "meta_info": meta}).encode() + b"\n\n")
            while hold and not sim.gracefully_exit:  # in flight, its first step out, until the server drains
                await asyncio.sleep(0.05)
    finally:
        sim.active -= 1
    meta["finish_reason"] = {"type": "length", "length": max_tokens}
    meta["e2e_latency"] = time.monotonic() - begin
    if sim.speculative:
        sim.verify_steps += verify
        sim.spec_tokens += len(output_ids)
        if sim.args.spec_meta != "none":  # "none": only /server_info tells the accept length
            meta["spec_verify_ct"] = verify
        if sim.args.spec_meta == "full":  # builds before spec_accept_length report only spec_verify_ct
            meta["spec_accept_length"] = len(output_ids) / verify
    if sim.rule and input_ids:
        output_ids, tops = rule_tokens(sim, input_ids, len(output_ids))
        if body.get("return_logprob") and int(body.get("top_logprobs_num") or 0) >= 2:
            if sim.args.fallback_fault and served["step0_fallback"]:  # the verify path read the wrong logits
                tops = [[[lp - 0.5, t, x] for lp, t, x in top] for top in tops]
            meta["output_top_logprobs"] = tops
    final = {"text": "tok " * len(output_ids), "output_ids": output_ids, "meta_info": meta}
    if grammar is not None:
        final["text"] = grammar
        meta["finish_reason"] = {"type": "stop", "matched": EOS}
    _cut_at_stop(final, params.get("stop"))
    count = int(params.get("n") or 1)
    if count > 1 and stream is None:
        encoded = json.dumps([{**final, "meta_info": {**meta, "id": f"req-{number}-{i}"}}
                              for i in range(count)]).encode()
        return web.Response(body=encoded, content_type="application/json")
    encoded = json.dumps(final).encode()
    if sim.args.bad_text:
        bad = {"bytes": b"\xc3\x28\xff", "surrogate": b"\\ud800"}[sim.args.bad_text]
        encoded = encoded.replace(b'tok "', b"tok " + bad + b'"', 1)
    if stream is None:
        return web.Response(body=encoded, content_type="application/json")
    await stream.write(b"data: " + encoded + b"\n\n")
    await stream.write(b"data: [DONE]\n\n")
    await stream.write_eof()
    return stream


EOS = 2  # the test models' end of sequence (rig testmodel writes BOS, EOS, PAD first)
FALLBACK_ORDER = ("grammar", "logprobs", "penalties")  # the patch's _rig_batch_refusal, in its order


def _smallest_instance(schema: object) -> str | None:
    """A json_schema's smallest instance, as the grammar makes a greedy model end it (None: no schema given)."""
    if not isinstance(schema, str):
        return None
    spec = json.loads(schema)
    props = spec.get("properties") or {}
    return json.dumps({k: (props.get(k) or {}).get("enum", [""])[0] for k in spec.get("required") or []},
                      separators=(",", ":"))


def _fallback_reason(body: dict, params: dict, grammar: str | None) -> str | None:
    """What of the request makes the free-off patch send its step-0 batch down SGLang's verify path."""
    penalties = any(float(params.get(k) or 0) for k in ("frequency_penalty", "presence_penalty")) or \
        float(params.get("repetition_penalty") or 1) != 1
    found = {"grammar": grammar is not None, "logprobs": bool(body.get("return_logprob")), "penalties": penalties}
    return next((reason for reason in FALLBACK_ORDER if found[reason]), None)


def _cut_at_stop(final: dict, stop: object) -> None:
    """SGLang's stop strings: the text cut before the first match, the tokens at the one that completed it."""
    strings = [stop] if isinstance(stop, str) else [s for s in stop or [] if isinstance(s, str) and s]
    text = final["text"]
    hits = [(text.find(s), s) for s in strings if s in text]
    if not hits:
        return
    at, matched = min(hits)
    final["text"] = text[:at]
    final["output_ids"] = final["output_ids"][:-(-(at + len(matched)) // 4)]  # "tok " is four characters a token
    final["meta_info"]["finish_reason"] = {"type": "stop", "matched": matched}
    final["meta_info"]["completion_tokens"] = len(final["output_ids"])


async def _forever(stream, meta: dict) -> None:
    """A request that never ends: chunks every 0.2 s whatever max_new_tokens said, or silence (not streaming)."""
    count = 0
    while True:
        await asyncio.sleep(0.2)
        count += 1
        if stream is not None:
            await stream.write(b"data: " + json.dumps({"text": "tok " * count, "output_ids": list(range(count)),
                                                       "meta_info": {**meta, "completion_tokens": count}}).encode()
                               + b"\n\n")


async def _paced(sim: Simulator, max_tokens: int):
    """Tokens per step of one request at the single-stream rate or its share of the capacity."""
    due = time.monotonic()
    for step in _steps(max_tokens, sim.args.accept_length):
        # pace by deadline, so the time spent writing chunks does not slow the simulated model
        due += step / sim.speed()
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        yield step


def app(args: argparse.Namespace) -> web.Application:
    application = web.Application()
    application["sim"] = Simulator(args)
    application.router.add_get("/health", health)
    application.router.add_get("/health_generate", health)
    application.router.add_get("/server_info", server_info)
    application.router.add_get("/get_server_info", server_info)
    application.router.add_route("*", "/flush_cache", flush_cache)
    application.router.add_post("/start_profile", start_profile)
    application.router.add_post("/stop_profile", stop_profile)
    application.router.add_route("*", "/generate", generate)
    application.router.add_route("*", "/rig_test/stats", stats)
    return application


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--rate", type=float, default=RATE, help="single-stream tokens/s")
    p.add_argument("--capacity", type=float, default=0.0, help="total tokens/s shared by running requests (0: none)")
    p.add_argument("--accept-length", type=float, default=0.0, help="tokens per verify step; 0: no speculation")
    p.add_argument("--spec-meta", choices=("full", "verify-only", "none"), default="full",
                   help="speculation fields in meta_info: both, spec_verify_ct only (older builds), or none")
    p.add_argument("--start-delay", type=float, default=0.0, help="seconds of 503 from the health endpoints")
    p.add_argument("--die-after", type=int, default=0, help="exit mid-stream in request N")
    p.add_argument("--malformed-every", type=int, default=0, help="a malformed chunk in every Kth request")
    p.add_argument("--stream-forever", action="store_true", help="never end a request (a chunk every 0.2 s)")
    p.add_argument("--bad-text", choices=("bytes", "surrogate"), default="",
                   help="the final text ends in bytes that are not UTF-8, or in a lone surrogate (\\ud800)")
    p.add_argument("--api-key", default="")
    p.add_argument("--context-length", type=int, default=32768, help="prompt + output tokens a request may ask for")
    p.add_argument("--hide-context", action="store_true", help="leave the context length out of /server_info")
    p.add_argument("--step-ms", type=float, default=0.0, help="the batched scheduler: fixed cost of one step (0: off)")
    p.add_argument("--token-ms", type=float, default=0.0, help="cost per verified token of each running request")
    p.add_argument("--draft-ms", type=float, default=0.0, help="cost per draft step under speculation")
    p.add_argument("--extend-ms", type=float, default=0.0, help="draft-extend cost per running request, step 0 too")
    p.add_argument("--verify-ms", type=float, default=0.0,
                   help="what a verify forward costs over a decode, per running request, under speculation")
    p.add_argument("--free-off", action="store_true",
                   help="step 0 runs as a plain decode (no verify cost), as rig's free-off patch makes it")
    p.add_argument("--steps", type=int, default=0, help="speculative steps per decode (0: no speculation)")
    p.add_argument("--accept-rate", type=float, default=0.0, help="acceptance probability of each drafted position")
    p.add_argument("--sampled-accept", type=float, default=0.7,
                   help="the target's probability of the draft token at temperature 1 (acceptance falls with it)")
    p.add_argument("--max-running-requests", type=int, default=0,
                   help="requests run at once (0: SGLang's default, 48 under speculation)")
    p.add_argument("--adaptive-config", default="", help="SGLang's adaptive speculation config (JSON)")
    p.add_argument("--cuda-graph-bs", default="1,2,4,8,16,32,64,128,256", help="CUDA-graph batch sizes")
    p.add_argument("--rule", default="", help="a numerics test model's testmodel.json: input_ids get its rule's tokens")
    p.add_argument("--numerics-fault", choices=("none", "wrong", "garbage", "speculative", "after-switch"),
                   default="none",
                   help="wrong: every fifth token another rule token; garbage: token 0 and no logprobs (NaN "
                        "logits); speculative: other tokens from the sixth on, under speculation only; after-switch: "
                        "other tokens from the 41st on once a free-off server went back from step 0 to drafting")
    p.add_argument("--free-off-hold", type=int, default=64, help="the free-off patch's RIG_FREE_OFF_HOLD (steps)")
    p.add_argument("--grammar-backend", default="xgrammar", help="SGLang's; none: json_schema is not followed")
    p.add_argument("--fallback-fault", action="store_true",
                   help="a request served in a free-off step-0 batch on SGLang's verify path gets logprobs 0.5 lower")
    p.add_argument("--stale-draft", action="store_true",
                   help="after a free-off server's step 0, drafting accepts half as often (a draft out of step)")
    return p.parse_args(argv)


async def serve(options: argparse.Namespace, host: str = "127.0.0.1") -> None:
    """Serve until SIGTERM or SIGINT, then drain: 503 from the health endpoints, finish what runs, exit."""
    application = app(options)
    if options.step_ms > 0:
        scheduler = asyncio.get_running_loop().create_task(application["sim"].schedule())
        application["scheduler"] = scheduler  # held, so the loop does not lose the task
    runner = web.AppRunner(application, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, options.port).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    sim = application["sim"]
    sim.gracefully_exit = True
    print(f"Gracefully exiting... Remaining number of requests {sim.active}.", flush=True)  # as SGLang logs it
    while sim.active:
        await asyncio.sleep(0.1)
    await runner.cleanup()


if __name__ == "__main__":
    asyncio.run(serve(parse()))
