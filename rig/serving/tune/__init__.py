"""`rig tune`: when does speculation pay on this box, and how to serve so that it always does.

On the box itself, one server at a time (each may need every GPU), each started from the stack's
own server line (`rig server args`), health-gated by `rig smoke`, measured, stopped, its log kept:

1. the variants: per attention backend (server.attention_backends), the baseline and fixed EAGLE-3 at
   each of tune.steps (topk 1, steps + 1 draft tokens: SGLang's adaptive mode takes topk 1 only), the
   stack's own line when it is none of those, and SGLang's step 0 as servers of their own (tune.step0:
   as shipped, with the draft extend skipped where the installed sglang reads that variable, and as
   rig's free-off patch makes it, a plain decode, where the venv has it applied);
   a speculative server that caps its running requests below its decode graph (SGLang sets 48 when
   unset) is measured again with the cap lifted to the graph size;
2. every level (bench.concurrency closed-loop, tune.request_rates open-loop Poisson), in rounds at the
   plan's temperature, each round at least bench.min_requests requests and bench.min_seconds long,
   each round's server-side accept length read after it (rig.serving.measure);
3. the choice per level, within each family of variants one server line can switch between (one
   backend, one cap): the variant with the best median (output tok/s, at a request rate each request's own
   tok/s, or goodput under the SLOs), ties
   going to the simpler one (baseline < fewer steps < more); where choices change with load, the
   step-0 slots take the family's measured step-0 server's numbers when there is one. The family whose
   choices come closest to the per-level best of every variant (geometric mean) gives the policy;
4. the policy: one choice everywhere is served as it is (no speculation, or fixed EAGLE-3); choices
   that change with load become SGLang's adaptive config, one candidate per slot (deterministic: no
   EMA flapping), each level's slot keyed at the CUDA-graph batch its running batch pads to;
5. confirmation: the policy's own server at every level, in rounds, against the baseline and the
   per-level best. Where the policy is not within noise of the best, the report says so with the
   ratio, and names what does pay;
6. the proposal: what to serve, and the stack file with the policy in it (every comment kept).

A variant whose every request failed, or that claims EAGLE-3 while its server runs no speculation, is
a failure with its reason, never a measurement the policy builds on.

The stack is read once and never changed: the plan (rig.serving.measure.plan) carries the levels, and each
server's line is a stack derived from it (rig.stack.derive). The modules follow the steps: run (the
steps in order), variants (1), measure (1, 2, and the dry run), choose (3, 4), confirm (5), propose (6),
report (report.md, tune.png).
"""
