"""Generate the free-off draft patch files (rig's patch format) for sglang 0.5.17 and 0.5.23 into patches/.

    python docs/validation/free-off/make_patches.py      # then: python docs/validation/free-off/check_anchors.py

The hunks are written here as Python text so the shared code stays one copy; the
differences between the versions are the few spellings substituted below.
"""
import sys
from pathlib import Path

import yaml

OUT = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[3] / "rig" / "patches" / "set"

# --------------------------------------------------------------------------- module block

MODULE_BLOCK = '''

# rig free-off (opt-in: a stack's patches.opt_in lists free-off; on where applied,
# RIG_FREE_OFF=0 in a server's environment turns it off for that server) ------
# An adaptive step-0 batch (no drafting) runs the target as a plain DECODE on
# decode CUDA graphs captured at start for the batch sizes whose adaptive slot
# lists step 0, samples with the target's own sampler, and keeps the draft in
# step: RIG_FREE_OFF_DRAFT=ingest (default) writes only the draft layer's KV
# (fc, norms, qkv, rope, KV store) and repairs the draft's proposal once when
# drafting resumes; =extend runs SGLang's one-token draft extend (the two
# write the same bits, real-cost runs 9-10). Batches
# the plain path does not cover (grammar, logprobs, penalties, ...) take
# SGLang's step-0 verify path; _rig_note_fallback logs them.
import collections as _rig_collections
import os as _rig_os
from types import SimpleNamespace as _RigNS

_RIG_FREE_OFF = _rig_os.environ.get("RIG_FREE_OFF", "1") != "0"
_RIG_FREE_OFF_DRAFT = _rig_os.environ.get("RIG_FREE_OFF_DRAFT", "ingest")
# RIG_FREE_OFF_HOLD=N (default 64, 0: SGLang's routing): the adaptive slot is
# chosen by the largest batch of the last N decode steps, so a batch that dips
# below a step-0 slot for a few steps (a wave's ramp, a closed loop's gaps)
# stays at step 0 rather than drafting out of step with the rest and back
_RIG_FREE_OFF_HOLD = _rig_os.environ.get("RIG_FREE_OFF_HOLD", "64")
# RIG_FREE_OFF_CHECK=1 (a numerics check, not for serving): each ingest step
# also runs the draft extend and the repair, and compares what they wrote
_RIG_FREE_OFF_CHECK = _rig_os.environ.get("RIG_FREE_OFF_CHECK", "0") == "1"
_rig_checked = {"steps": 0, "slots": 0, "missed": 0, "unequal": 0, "topk_same": 0}
_rig_checked.update({f"{name}{end}": 0.0 for name in ("ingest_k", "ingest_v", "repair_k", "repair_v", "hidden")
                     for end in ("", "_max")})
_rig_fallbacks = {}
_rig_switches = {"count": 0}


def _rig_hold_steps():
    """RIG_FREE_OFF_HOLD as a step count, and a note when it was not one."""
    text = _RIG_FREE_OFF_HOLD
    if text.isascii() and text.isdigit() and len(text) <= 6:
        return int(text), None
    return 64, f"RIG_FREE_OFF_HOLD={text!r} ignored (a whole number of steps, 0-999999): 64"


def _rig_note_switch(before, after, batch_size, routed):
    """Count a switch of the adaptive state; log the 1st, 2nd, 4th, 8th, ..."""
    _rig_switches["count"] += 1
    count = _rig_switches["count"]
    if count & (count - 1) == 0:
        log_info_on_rank0(
            logger,
            f"rig free-off: steps {before} -> {after} at batch {batch_size} "
            f"(routed as {routed}); {count} switch(es) so far",
        )


def _rig_note_fallback(reason):
    """Count a step-0 batch that took SGLang's verify path; log the 1st, 2nd,
    4th, 8th, ... of each reason (visible, never a flood)."""
    count = _rig_fallbacks.get(reason, 0) + 1
    _rig_fallbacks[reason] = count
    if count & (count - 1) == 0:
        log_info_on_rank0(
            logger,
            f"rig free-off: step 0 took SGLang's verify path ({reason}); "
            f"{count} batch(es) so far",
        )


class _RigPlainDecodeGraphRunner(DecodeCudaGraphRunner):
    """Plain DECODE graphs on the speculative target: no spec input, the
    hidden states the draft reads captured in full (the rig hunk in
    decode_cuda_graph_runner.py reads rig_plain_decode)."""

    rig_plain_decode = True

    def get_spec_info(self, num_tokens):
        return None

    def can_run_graph(self, forward_batch):
        return forward_batch.forward_mode.is_decode() and super().can_run_graph(
            forward_batch
        )
'''

# --------------------------------------------------------------------------- methods

METHODS = '''    # -- rig free-off (on where applied; RIG_FREE_OFF=0 turns it off) ----------

    def _rig_draft_ctx(self, stage):
        stack = contextlib.ExitStack()
        stack.enter_context(
            @@DRAFT_TP_CONTEXT@@
        )
        stack.enter_context(speculative_moe_backend_context())
        stack.enter_context(speculative_moe_a2a_backend_context())
        stack.enter_context(spec_stage_span(stage))
        return stack

    def _rig_static_refusal(self):
        """Why free-off stays off for this server (None: it can run)."""
        if not _is_cuda:
            return "not a CUDA device"
        if 0 not in self.adaptive_controller.candidate_steps:
            return "no adaptive slot lists step 0"
        target_model_runner = self._target_worker.model_runner
        if target_model_runner.model_config.model_is_mrope:
            return "the target uses mrope positions"
        if getattr(target_model_runner.req_to_token_pool, "mamba_pool", None) is not None:
            return "the target is a hybrid (mamba) model"
        kv_pool = type(target_model_runner.token_to_kv_pool).__name__
        if kv_pool not in ("MHATokenToKVPool", "MLATokenToKVPool"):
            return f"the target's KV pool is {kv_pool}"
        if target_model_runner.hisparse_coordinator is not None:
            return "hisparse"
@@STATIC_EXTRA@@        return None

    def _rig_ingest_refusal(self):
        """Why the KV-only ingest cannot keep this draft in step (None: it can)."""
        draft_runner = self._draft_worker.draft_runner
        name = type(draft_runner.model).__name__
        if name != "LlamaForCausalLMEagle3":
            return f"the draft is {name}, not LlamaForCausalLMEagle3"
        model = draft_runner.model.model
        if len(model.layers) != 1:
            return f"the draft has {len(model.layers)} layers"
        if model.is_mrope_enabled:
            return "the draft uses mrope positions"
        if model.layers[0].self_attn.attn.sliding_window_size not in (None, -1):
            return "the draft attends through a sliding window"
        kv_pool = type(draft_runner.token_to_kv_pool).__name__
        if kv_pool != "MHATokenToKVPool":
            return f"the draft's KV pool is {kv_pool}"
        if getattr(draft_runner.attn_backend, "dcp_size", 1) > 1:
            return "decode context parallelism"
        if get_spec().speculative_use_rejection_sampling:
            return "rejection sampling (the draft's probabilities are needed)"
        if self._draft_worker.seed_dsa_topk_from_draft_extend:
            return "the draft seeds DSA indices from its extend"
@@INGEST_EXTRA@@        return None

    def _rig_step0_sizes(self):
        """The decode graph sizes whose adaptive slot lists step 0, as SGLang's
        policy routes them. SGLang hands the policy its decode graph sizes at
        init_states; where it handed None with graphs on (a build that keeps
        the sizes in cuda_graph_config only: every state then captures them
        all), the sizes the target's runner captured are asked of the policy
        the same way, and the policy is left as SGLang set it."""
        params = self.adaptive_controller.params
        sizes = params.cuda_graph_bs_for_step(0)
        if sizes is not None:
            return sizes
        runner = getattr(self._target_worker.model_runner, "decode_cuda_graph_runner", None)
        captured = sorted(getattr(runner, "capture_bs", None) or [])
        if not captured:
            return None
        params.set_cuda_graph_bs(captured)
        try:
            return params.cuda_graph_bs_for_step(0)
        finally:
            params.set_cuda_graph_bs(None)

    def _rig_build_decode_graphs(self):
        """Capture plain DECODE graphs on the target for the batch sizes whose
        adaptive slot lists step 0, on an attention backend of their own (a
        backend's graph state belongs to one runner). Runs once at start, after
        SGLang built its per-step states; leaves free-off off when it cannot run."""
        self._rig_draft_mode = None
        self._rig_decode_runner = None
        self._rig_ingest_pending = False
        self._rig_held = None
        if not _RIG_FREE_OFF:
            return
        reason = self._rig_static_refusal()
        if reason is not None:
            log_info_on_rank0(
                logger,
                f"rig free-off: off ({reason}); step 0 keeps SGLang's verify path",
            )
            return
        bs_list = self._rig_step0_sizes()
        if bs_list:
            tic = time.perf_counter()
            before_mem = get_available_gpu_memory(self.device, self.gpu_id)
            with self._override_worker_state(0, 1, cuda_graph_bs=bs_list):
                target_model_runner = self._target_worker.model_runner
                backup_init = target_model_runner.init_new_workspace
                try:
                    attn_backend = target_model_runner._get_attention_backend(
                        init_new_workspace=True
                    )
                finally:
                    target_model_runner.init_new_workspace = backup_init
                self._rig_decode_runner = _RigPlainDecodeGraphRunner(
                    target_model_runner,
                    attn_backend=attn_backend,
                    speculative_num_steps=0,
                    speculative_num_draft_tokens=1,
                )
            after_mem = get_available_gpu_memory(self.device, self.gpu_id)
            graphs = (
                f"decode CUDA graphs bs={self._rig_decode_runner.capture_bs} "
                f"({time.perf_counter() - tic:.2f} s, {before_mem - after_mem:.2f} GB)"
            )
        else:
            graphs = (
                "no decode CUDA graphs (CUDA graphs are off, or no captured size "
                "routes to step 0): eager decode"
            )
        draft = _RIG_FREE_OFF_DRAFT
        if draft == "ingest":
            why = self._rig_ingest_refusal()
            if why is not None:
                draft = f"extend (ingest refused: {why})"
        elif draft != "extend":
            draft = f"extend (RIG_FREE_OFF_DRAFT={_RIG_FREE_OFF_DRAFT!r} is neither extend nor ingest)"
        self._rig_draft_mode = "ingest" if draft == "ingest" else "extend"
        self._rig_check = False
        if _RIG_FREE_OFF_CHECK and draft == "ingest":
            why = self._rig_check_refusal()
            self._rig_check = why is None
            draft += "; checked against extend" if why is None else f"; not checked ({why})"
        hold, note = _rig_hold_steps()
        if hold:
            self._rig_held = _rig_collections.deque(maxlen=hold)
        log_info_on_rank0(
            logger,
            f"rig free-off: on; step 0 decodes plainly on {graphs}; draft sync: {draft}; "
            f"hold: {hold} step(s)" + (f" ({note})" if note else ""),
        )

    def _rig_activate(self, batch_size):
        """SGLang's routing by batch size, held: with free-off on, the slot is
        the one of the largest batch of the last RIG_FREE_OFF_HOLD decode
        steps. The batch sizes are the scheduler's, the same on every TP rank,
        so every rank takes the same state at every step."""
        held = getattr(self, "_rig_held", None)
        routed = batch_size
        if held is not None:
            held.append(batch_size)
            routed = max(held)
        before = self.speculative_num_steps
        self.adaptive_controller.activate_step_by_batch(routed)
        if self.speculative_num_steps != before:
            _rig_note_switch(before, self.speculative_num_steps, batch_size, routed)

    def _rig_batch_refusal(self, batch):
        """Why this step-0 batch takes SGLang's verify path (None: it decodes
        plainly). Read from batch state every TP rank shares, so ranks agree."""
        if batch.forward_mode.is_idle():
            return "idle batch"
        if batch.has_grammar:
            return "grammar"
        if batch.return_logprob:
            return "logprobs"
        if batch.return_hidden_states:
            return "hidden states requested"
        info = batch.sampling_info
        if info.acc_additive_penalties is not None or info.acc_scaling_penalties is not None:
            return "penalties"
        if info.has_custom_logit_processor:
            return "custom logit processor"
        return None

    def _rig_free_off_ready(self, batch):
        if getattr(self, "_rig_draft_mode", None) is None:
            return False
        reason = self._rig_batch_refusal(batch)
        if reason is None:
            return True
        _rig_note_fallback(reason)
        return False

    def _rig_free_off_step(self, batch, on_publish):
        """Step 0 as a plain decode: the last bonus token through the target in
        DECODE mode, sampled normally, returned in the shape of SGLang's 1-node
        verify (accept length 1, one row a request) so the scheduler, the
        FutureMap relay, the counters and the adaptive controller see no change."""
        from sglang.kernels.ops.speculative.cache_locs import (
            assign_extend_cache_locs_uniform_func,
        )
        from sglang.srt.model_executor.forward_batch_info import ForwardMode
        from sglang.srt.speculative.spec_utils import (
            record_stream_each,
            record_stream_for_v2_verify,
        )

        target_model_runner = self._target_worker.model_runner
        draft_input = batch.spec_info
        bs = batch.seq_lens.shape[0]
        seq_lens = batch.seq_lens
        seq_lens_cpu, seq_lens_sum = batch.seq_lens_cpu, batch.seq_lens_sum
        # As run_eagle_verify: the SB tensors this step rebinds stay alive for
        # the forward stream's queued work (caching-allocator lifetime).
        fwd_stream = torch.get_device_module(self.device).current_stream()
        record_stream_for_v2_verify(batch, None, fwd_stream)

        # Spec v2 keeps seq_lens at the length before this step's token: the
        # bonus token sits at position seq_lens, in the slot the 1-node verify
        # would have written.
        out_cache_loc = assign_extend_cache_locs_uniform_func(
            batch.req_pool_indices,
            self.req_to_token_pool.req_to_token,
            seq_lens,
            bs,
            1,
            self.device,
        )
        batch.input_ids = draft_input.bonus_tokens
        batch.out_cache_loc = out_cache_loc
        record_stream_each((batch.input_ids, batch.out_cache_loc), fwd_stream)
        batch.forward_mode = ForwardMode.DECODE
        batch.spec_info = None
        # A DECODE forward counts the token it writes (positions = seq_lens).
        batch.seq_lens = seq_lens + 1
        batch.seq_lens_cpu = None if seq_lens_cpu is None else seq_lens_cpu + 1
        batch.seq_lens_sum = None if seq_lens_sum is None else seq_lens_sum + bs
        try:
            forward_batch = ForwardBatch.init_new(
                batch,
                target_model_runner,
                capture_hidden_mode=(
                    CaptureHiddenMode.NULL
                    if self.speculative_algorithm.is_standalone()
                    else CaptureHiddenMode.FULL
                ),
                return_hidden_states_before_norm=False,
            )
        finally:
            # the draft side reads the spec-v2 lengths
            batch.seq_lens = seq_lens
            batch.seq_lens_cpu, batch.seq_lens_sum = seq_lens_cpu, seq_lens_sum

        # The step-0 state's own runner captured TARGET_VERIFY graphs; the
        # plain decode replays the rig runner's DECODE graphs (eager when the
        # batch is past them), on that runner's backend, for this forward only.
        runner = self._rig_decode_runner
        saved = (
            target_model_runner.decode_cuda_graph_runner,
            target_model_runner.attn_backend,
        )
        target_model_runner.decode_cuda_graph_runner = runner
        if runner is not None:
            target_model_runner.attn_backend = runner.attn_backend
        try:
            output = self.target_worker.forward_batch_generation(
                batch=None, forward_batch=forward_batch
            )
        finally:
            (
                target_model_runner.decode_cuda_graph_runner,
                target_model_runner.attn_backend,
            ) = saved

        next_token_ids = output.next_token_ids
        new_seq_lens = seq_lens + 1
        batch_output = GenerationBatchResult(
            logits_output=output.logits_output,
            next_token_ids=next_token_ids,
            can_run_cuda_graph=output.can_run_cuda_graph,
            speculative_num_draft_tokens=1,
            next_draft_input=EagleDraftInput(
                bonus_tokens=next_token_ids.to(torch.int32)
            ),
            accept_lens=torch.ones((bs,), dtype=torch.int32, device=self.device),
            new_seq_lens=new_seq_lens,
            routed_experts_output=output.routed_experts_output,
            indexer_topk_output=output.indexer_topk_output,
            extra_keep_alive_refs=[forward_batch],
        )
        # Publish before the draft side so the fence is at target-end, as verify does.
        if on_publish is not None:
            on_publish(new_seq_lens)
        with self._rig_draft_ctx("draft_extend"):
            if self._rig_draft_mode == "ingest" and self._rig_check:
                self._rig_check_ingest(batch, batch_output, out_cache_loc, forward_batch.positions)
            elif self._rig_draft_mode == "ingest":
                self._rig_ingest(out_cache_loc, forward_batch.positions, batch_output)
            else:
                self.draft_worker._draft_extend_for_decode(batch, batch_output)
        return batch_output

    def _rig_ingest(self, out_cache_loc, positions, batch_output):
        """Write the draft layer's KV for this step's position and nothing else:
        fc over the target's aux hidden states, the norms, qkv, rope and the KV
        store; no attention output, MLP or lm_head. The fc output rides the
        relay as the draft hidden state, topk_p = 0 marks "no proposal yet"."""
        draft_runner = self._draft_worker.draft_runner
        model = draft_runner.model.model
        layer = model.layers[0]
        hidden = batch_output.logits_output.hidden_states
        if hidden.shape[-1] != layer.hidden_norm.weight.shape[-1]:
            # as LlamaModel.forward (llama_eagle3): norms, then fc
            if model.input_norm is not None:
                hidden = model.input_norm(hidden)
            if model.fc_norm is not None:
                chunks = hidden.chunk(model.num_aux_hidden_states, dim=-1)
                hidden = torch.cat(
                    [norm(chunk) for norm, chunk in zip(model.fc_norm, chunks)], dim=-1
                )
            hidden = model.fc(hidden)
        embeds = layer.input_layernorm(
            model.embed_tokens(batch_output.next_token_ids.to(torch.int64))
        )
        _, k, v = layer.self_attn.forward_prepare_native(
            positions=positions,
            hidden_states=torch.cat([embeds, layer.hidden_norm(hidden)], dim=-1),
        )
        radix = layer.self_attn.attn
        k = k.view(-1, radix.tp_k_head_num, radix.qk_head_dim)
        v = v.view(-1, radix.tp_v_head_num, radix.v_head_dim)
        if radix.k_scale is None and radix.v_scale is None:
            draft_runner.token_to_kv_pool.set_kv_buffer(radix, out_cache_loc, k, v)
        else:
            draft_runner.token_to_kv_pool.set_kv_buffer(
                radix, out_cache_loc, k, v, radix.k_scale, radix.v_scale
            )
        bs = hidden.shape[0]
        next_draft_input = batch_output.next_draft_input
        next_draft_input.topk_p = torch.zeros(
            (bs, self.topk), dtype=torch.float32, device=self.device
        )
        next_draft_input.topk_index = torch.zeros(
            (bs, self.topk), dtype=torch.int64, device=self.device
        )
        next_draft_input.hidden_states = hidden
        self._rig_ingest_pending = True
        # No draft-extend graph published a read-done event this step: the
        # scheduler takes its whole-forward WAR fence.
        draft_runner.@@READ_DONE_EVENT@@ = None

    def _rig_check_refusal(self):
        """Why RIG_FREE_OFF_CHECK cannot read the draft KV slot by slot (None:
        it can): one token a slot, stored as computed."""
        pool = self._draft_worker.draft_runner.token_to_kv_pool
        if self.page_size != 1:
            return f"pages of {self.page_size} tokens"
        if getattr(pool, "store_dtype", pool.dtype) != pool.dtype:
            return "a quantized KV cache"
        return None

    def _rig_check_ingest(self, batch, batch_output, out_cache_loc, positions):
        """RIG_FREE_OFF_CHECK=1, in place of the plain ingest: the ingest, then
        SGLang's one-token draft extend over the same positions (it writes the
        same slots; its KV and proposal stay, as in extend mode), then the
        repair the next drafting step would run on ingest's state, each onto
        the step's slots zeroed first (a slot left at zero was not written),
        each read back and compared with the extend's. Logs the counts and the
        largest differences so far on the 1st, 2nd, 4th, ... and every 256th
        checked step. Host syncs every step: a check, not for serving."""
        draft_runner = self._draft_worker.draft_runner
        layer_id = draft_runner.model.model.layers[0].self_attn.attn.layer_id
        pool = draft_runner.token_to_kv_pool
        kv = (pool.get_key_buffer(layer_id), pool.get_value_buffer(layer_id))
        bs = out_cache_loc.shape[0]

        def zeroed():
            for buf in kv:
                buf[out_cache_loc] = 0

        def written():
            found = tuple(buf[out_cache_loc].float() for buf in kv)
            zeroed()
            return found

        zeroed()
        self._rig_ingest(out_cache_loc, positions, batch_output)
        ingest_kv = written()
        ingest_hidden = batch_output.next_draft_input.hidden_states
        self._rig_ingest_pending = False
        batch_output.next_draft_input = EagleDraftInput(
            bonus_tokens=batch_output.next_token_ids.to(torch.int32)
        )
        self.draft_worker._draft_extend_for_decode(batch, batch_output)
        extend_kv = written()
        extend = batch_output.next_draft_input
        extend_index, extend_hidden = extend.topk_index.clone(), extend.hidden_states.clone()

        repair = EagleDraftInput(bonus_tokens=extend.bonus_tokens)
        repair.topk_p = torch.zeros((bs, self.topk), dtype=torch.float32, device=self.device)
        repair.topk_index = torch.zeros((bs, self.topk), dtype=torch.int64, device=self.device)
        repair.hidden_states = ingest_hidden
        saved = (batch.seq_lens, batch.seq_lens_cpu, batch.seq_lens_sum, batch.spec_info)
        # as the next step sees the batch: one token longer
        batch.seq_lens = saved[0] + 1
        batch.seq_lens_cpu = None if saved[1] is None else saved[1] + 1
        batch.seq_lens_sum = None if saved[2] is None else saved[2] + bs
        batch.spec_info = repair
        try:
            self._rig_repair_after_ingest(batch)
        finally:
            batch.seq_lens, batch.seq_lens_cpu, batch.seq_lens_sum, batch.spec_info = saved
        repair_kv = written()
        for buf, extended in zip(kv, extend_kv):  # the extend's KV stays, as in extend mode
            buf[out_cache_loc] = extended.to(buf.dtype)

        seen = _rig_checked
        seen["steps"] += 1
        seen["slots"] += bs
        for k, v in (ingest_kv, extend_kv, repair_kv):
            blank = (k.flatten(1) == 0).all(dim=1) | (v.flatten(1) == 0).all(dim=1)
            seen["missed"] += int(blank.sum().item())
        seen["topk_same"] += int((repair.topk_index == extend_index).all(dim=1).sum().item())
        for name, a, b in (
            ("ingest_k", ingest_kv[0], extend_kv[0]), ("ingest_v", ingest_kv[1], extend_kv[1]),
            ("repair_k", repair_kv[0], extend_kv[0]), ("repair_v", repair_kv[1], extend_kv[1]),
            ("hidden", repair.hidden_states.float(), extend_hidden.float()),
        ):
            seen["unequal"] += int((a != b).sum().item())  # NaN counts: NaN != NaN
            seen[name] = max(seen[name], (a - b).abs().max().item())
            seen[name + "_max"] = max(seen[name + "_max"], b.abs().max().item())
        if seen["steps"] & (seen["steps"] - 1) == 0 or seen["steps"] % 256 == 0:
            diffs = ", ".join(
                f"{name} {seen[name]:.4g} (of {seen[name + '_max']:.4g})"
                for name in ("ingest_k", "ingest_v", "repair_k", "repair_v", "hidden")
            )
            log_info_on_rank0(
                logger,
                f"rig free-off check: {seen['steps']} ingest step(s), {seen['slots']} slot(s), "
                f"{seen['missed']} write(s) missed, {seen['unequal']} element(s) unequal, "
                f"repaired proposal = extend's for {seen['topk_same']}; max|x - extend| {diffs}",
            )

    def _rig_repair_after_ingest(self, batch):
        """First drafting step after ingest steps: the draft's proposal (topk)
        and recurrent hidden at the last position were never computed. Run the
        one-token draft extend there (eager, on the step-0 state's draft
        backend; its graphs expect the target's aux width, this input is the
        fc output) for the requests marked topk_p == 0; the others keep theirs
        and write only the padding slot 0."""
        self._rig_ingest_pending = False
        state0 = self.adaptive_controller._states.get(0)
        if batch.forward_mode.is_idle() or state0 is None:
            return
        from sglang.kernels.ops.speculative.cache_locs import (
            assign_extend_cache_locs_uniform_func,
        )

        dw = self._draft_worker
        draft_input = batch.spec_info
        bs = batch.seq_lens.shape[0]
        mask = draft_input.topk_p[:, :1] == 0
        saved_batch = (
            batch.seq_lens,
            batch.seq_lens_cpu,
            batch.seq_lens_sum,
            batch.input_ids,
            batch.out_cache_loc,
            batch.forward_mode,
            batch.spec_info,
        )
        saved_dw = (
            dw.speculative_num_draft_tokens,
            dw.cuda_graph_runner_for_draft_extend,
            dw.draft_extend_attn_backend,
            dw.draft_runner.attn_backend,
        )
        prev = batch.seq_lens - 1
        loc = assign_extend_cache_locs_uniform_func(
            batch.req_pool_indices,
            self.req_to_token_pool.req_to_token,
            prev,
            bs,
            1,
            self.device,
        )
        batch.out_cache_loc = torch.where(mask[:, 0], loc, torch.zeros_like(loc))
        batch.seq_lens = prev
        if batch.seq_lens_cpu is not None:
            batch.seq_lens_cpu = batch.seq_lens_cpu - 1
        if batch.seq_lens_sum is not None:
            batch.seq_lens_sum = batch.seq_lens_sum - bs
        repaired = GenerationBatchResult(
            logits_output=_RigNS(hidden_states=draft_input.hidden_states),
            next_token_ids=draft_input.bonus_tokens,
            accept_lens=torch.ones((bs,), dtype=torch.int32, device=self.device),
            next_draft_input=EagleDraftInput(bonus_tokens=draft_input.bonus_tokens),
        )
        dw.speculative_num_draft_tokens = 1
        dw.cuda_graph_runner_for_draft_extend = None
        if state0.draft_extend_attn_backend is not None:
            dw.draft_extend_attn_backend = state0.draft_extend_attn_backend
            dw.draft_runner.attn_backend = state0.draft_extend_attn_backend
        try:
            with self._rig_draft_ctx("draft_extend"):
                dw._draft_extend_for_decode(batch, repaired)
        finally:
            (
                dw.speculative_num_draft_tokens,
                dw.cuda_graph_runner_for_draft_extend,
                dw.draft_extend_attn_backend,
                dw.draft_runner.attn_backend,
            ) = saved_dw
            (
                batch.seq_lens,
                batch.seq_lens_cpu,
                batch.seq_lens_sum,
                batch.input_ids,
                batch.out_cache_loc,
                batch.forward_mode,
                batch.spec_info,
            ) = saved_batch
        new = repaired.next_draft_input
        draft_input.topk_p = torch.where(mask, new.topk_p, draft_input.topk_p)
        draft_input.topk_index = torch.where(mask, new.topk_index, draft_input.topk_index)
        draft_input.hidden_states = torch.where(
            mask, new.hidden_states, draft_input.hidden_states
        )

'''

# the GPU runs of 0.5.17's patched files (docs/validation/real-cost-h200/README.md)
RUN_0517 = "2026-12-06: 0.5.17 served on an H200 and an H100 with these patches applied (real-cost runs 3-10)"

VERSIONS = {
    "0517": {
        "version": "0.5.17",
        "needed": ">=0.5.17,<0.5.18",
        "gpu_runs": ("Run with sglang 0.5.17 on an H200 and an H100 (TP 1, decode CUDA graphs; "
                     "docs/validation/real-cost-h200, runs 3-10): step 0 kept 0.98 of a plain server with "
                     "ingest at temperature 1, 0.70-0.86 with extend. Ingest is the default since runs 9-10 "
                     "(RIG_FREE_OFF_CHECK=1 at 16 and 64 running, 36,861 slots): its draft KV, and the "
                     "repair's KV, proposal and hidden state, equal the extend's bit for bit."),
        "gpu_checked": RUN_0517,
        "DRAFT_TP_CONTEXT": "self.draft_worker.draft_tp_context(self.draft_worker.draft_runner.tp_group)",
        "READ_DONE_EVENT": "war_fastpath_read_done_event",
        "STATIC_EXTRA": "        if target_model_runner.server_args.enable_lora:\n"
                        "            return \"LoRA\"\n",
        "INGEST_EXTRA": "        if self.server_args.enable_unified_memory:\n"
                        "            return \"the unified memory pool\"\n",
        "module_anchor": "logger = logging.getLogger(__name__)\n\n\nclass EagleDraftWorker(EagleDraftWorkerBase):\n",
        "step0_find": (
            "            if self.speculative_num_steps == 0:\n"
            "                # Drafting disabled (high batch size). _draft_extend below still\n"
            "                # runs, keeping draft KV warm for when the batch shrinks.\n"
            "                verify_input = self._build_trivial_verify_input(batch)\n"
            "            else:\n"
            "                with (\n"
        ),
        "step0_replace": (
            "            if self.speculative_num_steps == 0 and self._rig_free_off_ready(batch):\n"
            "                # rig free-off: step 0 is a plain decode\n"
            "                return self._rig_free_off_step(batch, on_publish)\n"
            "            if self.speculative_num_steps == 0:\n"
            "                # Drafting disabled (high batch size). _draft_extend below still\n"
            "                # runs, keeping draft KV warm for when the batch shrinks.\n"
            "                verify_input = self._build_trivial_verify_input(batch)\n"
            "            else:\n"
            "                if getattr(self, \"_rig_ingest_pending\", False):\n"
            "                    # rig free-off: the first drafting step after ingest steps\n"
            "                    self._rig_repair_after_ingest(batch)\n"
            "                with (\n"
        ),
    },
    "0523": {
        "version": "0.5.23",
        "needed": ">=0.5.23,<0.5.24",
        "gpu_runs": "Not yet run on a GPU with sglang 0.5.23 (0.5.17's file was: see that version's patch).",
        "gpu_checked": "not yet run on a GPU",
        "DRAFT_TP_CONTEXT": "draft_tp_context(self.draft_worker.parallel_layout)",
        "READ_DONE_EVENT": "shared_read_done_event",
        "STATIC_EXTRA": "        if target_model_runner.lora_manager is not None:\n"
                        "            return \"LoRA\"\n"
                        "        if get_parallel().pp_size > 1:\n"
                        "            return \"pipeline parallelism\"\n"
                        "        if current_platform.is_out_of_tree():\n"
                        "            return \"an out-of-tree platform\"\n"
                        "        if target_model_runner.watermark_state is not None:\n"
                        "            return \"watermarking\"\n",
        "INGEST_EXTRA": "        if draft_runner.kv_index_translator.is_translating:\n"
                        "            return \"the draft's KV ids are translated (unified pool)\"\n"
                        "        if getattr(draft_runner.token_to_kv_pool, \"requires_physical_write_loc\", False):\n"
                        "            return \"the draft's KV pool takes physical write locations\"\n",
        "module_anchor": "logger = logging.getLogger(__name__)\n\n\ndef _select_spec_graph_runner_cls(\n",
        "step0_find": (
            "            elif self.speculative_num_steps == 0:\n"
            "                # Drafting disabled (high batch size). _draft_extend below still\n"
            "                # runs, keeping draft KV warm for when the batch shrinks.\n"
            "                verify_input = self._build_trivial_verify_input(batch)\n"
            "            else:\n"
            "                with (\n"
        ),
        "step0_replace": (
            "            elif self.speculative_num_steps == 0 and self._rig_free_off_ready(batch):\n"
            "                # rig free-off: step 0 is a plain decode\n"
            "                return self._rig_free_off_step(batch, on_publish)\n"
            "            elif self.speculative_num_steps == 0:\n"
            "                # Drafting disabled (high batch size). _draft_extend below still\n"
            "                # runs, keeping draft KV warm for when the batch shrinks.\n"
            "                verify_input = self._build_trivial_verify_input(batch)\n"
            "            else:\n"
            "                if getattr(self, \"_rig_ingest_pending\", False):\n"
            "                    # rig free-off: the first drafting step after ingest steps\n"
            "                    self._rig_repair_after_ingest(batch)\n"
            "                with (\n"
        ),
    },
}

INIT_FIND = (
    "                self.adaptive_controller.init_states(\n"
    "                    cuda_graph_bs=(\n"
    "                        None\n"
    "                        if check_cuda_graph_backend(Phase.DECODE, Backend.DISABLED)\n"
    "                        else get_exec().graph.cuda_graph_bs_decode\n"
    "                    ),\n"
    "                )\n"
)
INIT_REPLACE = INIT_FIND + (
    "                # rig free-off: DECODE graphs for the step-0 batch sizes\n"
    "                self._rig_build_decode_graphs()\n"
)
METHODS_ANCHOR = "    def _build_trivial_verify_input(self, batch: ScheduleBatch) -> EagleVerifyInput:\n"
ACTIVATE_FIND = (
    "    def activate_step_by_batch(self, batch_size: int) -> None:\n"
    "        if self.adaptive_controller is not None:\n"
    "            self.adaptive_controller.activate_step_by_batch(batch_size)\n"
)
ACTIVATE_REPLACE = (
    "    def activate_step_by_batch(self, batch_size: int) -> None:\n"
    "        if self.adaptive_controller is not None:\n"
    "            # rig free-off: the routing held over RIG_FREE_OFF_HOLD steps\n"
    "            self._rig_activate(batch_size)\n"
)

RUNNER_FIND = (
    "        if model_runner.spec_algorithm.is_speculative():\n"
    "            if self.model_runner.is_draft_worker:\n"
)
RUNNER_REPLACE = (
    "        if model_runner.spec_algorithm.is_speculative() and getattr(\n"
    "            self, \"rig_plain_decode\", False\n"
    "        ):\n"
    "            # rig free-off: plain DECODE graphs on a speculative target (the\n"
    "            # adaptive step-0 batch sizes), capturing the hidden states the\n"
    "            # draft reads; the capture mode stays DECODE.\n"
    "            if not model_runner.spec_algorithm.is_standalone():\n"
    "                self.capture_hidden_mode = max(\n"
    "                    self.capture_hidden_mode, CaptureHiddenMode.FULL\n"
    "                )\n"
    "        elif model_runner.spec_algorithm.is_speculative():\n"
    "            if self.model_runner.is_draft_worker:\n"
)

WORKER_CHECK = '''import ast
import pathlib
import types

path = pathlib.Path(PATCHED_FILE)
tree = ast.parse(path.read_text())
classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
assert "_RigPlainDecodeGraphRunner" in classes, "the DECODE graph runner is missing"
methods = {f.name: f for f in classes["EAGLEWorkerV2"].body if isinstance(f, ast.FunctionDef)}
wanted = {"_rig_draft_ctx", "_rig_static_refusal", "_rig_ingest_refusal", "_rig_step0_sizes", "_rig_build_decode_graphs",
          "_rig_batch_refusal", "_rig_free_off_ready", "_rig_free_off_step", "_rig_ingest",
          "_rig_check_refusal", "_rig_check_ingest", "_rig_repair_after_ingest", "_rig_activate"}
assert wanted <= set(methods), sorted(wanted - set(methods))
# the runner half of free-off is applied too (the graphs it captures are DECODE graphs)
runner = path.parents[1] / "model_executor" / "runner" / "decode_cuda_graph_runner.py"
assert '"rig_plain_decode", False' in runner.read_text(), "apply the free-off graphs patch too"
# step 0 returns the plain decode before SGLang's trivial verify is built
step = ast.get_source_segment(path.read_text(), methods["forward_batch_generation"])
assert step.index("return self._rig_free_off_step(batch, on_publish)") < step.index(
    "self._build_trivial_verify_input(batch)")
assert step.index("self._rig_repair_after_ingest(batch)") < step.index("self.draft_worker.draft(batch)")
# init_cuda_graphs builds the graphs after SGLang's own per-step states
init = ast.get_source_segment(path.read_text(), methods["init_cuda_graphs"])
assert init.index("init_states(") < init.index("self._rig_build_decode_graphs()")

# behaviour, run from the file: the batch gate, the opt-in gate, the fallback log
def load(nodes, space):
    for node in nodes:
        node.decorator_list, node.returns = [], None
        for a in node.args.args:
            a.annotation = None
    exec(compile(ast.fix_missing_locations(ast.Module(body=nodes, type_ignores=[])), PATCHED_FILE, "exec"), space)
    return space

logged = []
space = load([functions["_rig_note_fallback"], methods["_rig_batch_refusal"], methods["_rig_free_off_ready"]],
             {"_rig_fallbacks": {}, "logger": None, "log_info_on_rank0": lambda _, m: logged.append(m)})
mode = types.SimpleNamespace(is_idle=lambda: False)
info = types.SimpleNamespace(acc_additive_penalties=None, acc_scaling_penalties=None,
                             has_custom_logit_processor=False)
def batch(**kw):
    base = dict(forward_mode=mode, has_grammar=False, return_logprob=False, return_hidden_states=False,
                sampling_info=info)
    base.update(kw)
    return types.SimpleNamespace(**base)
refusal = space["_rig_batch_refusal"]
assert refusal(None, batch()) is None
assert refusal(None, batch(has_grammar=True)) == "grammar"
assert refusal(None, batch(return_logprob=True)) == "logprobs"
assert refusal(None, batch(return_hidden_states=True)) == "hidden states requested"
assert refusal(None, batch(sampling_info=types.SimpleNamespace(
    acc_additive_penalties=1, acc_scaling_penalties=None, has_custom_logit_processor=False))) == "penalties"
assert refusal(None, batch(forward_mode=types.SimpleNamespace(is_idle=lambda: True))) == "idle batch"
worker = types.SimpleNamespace(_rig_batch_refusal=lambda b: refusal(None, b))
ready = space["_rig_free_off_ready"]
assert ready(worker, batch()) is False, "off unless _rig_build_decode_graphs turned it on"
worker._rig_draft_mode = "extend"
assert ready(worker, batch()) is True
for _ in range(5):
    assert ready(worker, batch(has_grammar=True)) is False
assert len(logged) == 3 and "(grammar); 4 batch(es)" in logged[-1], logged

# the step-0 graph sizes: the policy's own, else the captured sizes asked of it, the policy left as it was
class Policy:
    def __init__(self, given):
        self.given, self.calls = given, []
    def set_cuda_graph_bs(self, sizes):
        self.calls.append(sizes)
        self.given = sizes
    def cuda_graph_bs_for_step(self, step):
        return None if self.given is None else [v for v in self.given if v >= 2]  # slot "2" lists step 0
sizes = load([methods["_rig_step0_sizes"]], {})["_rig_step0_sizes"]
def worker(policy, captured):
    runner = types.SimpleNamespace(capture_bs=captured)
    return types.SimpleNamespace(adaptive_controller=types.SimpleNamespace(params=policy),
                                 _target_worker=types.SimpleNamespace(model_runner=types.SimpleNamespace(
                                     decode_cuda_graph_runner=runner)))
told = Policy([1, 2, 4])
assert sizes(worker(told, [1, 2, 4, 8])) == [2, 4] and told.calls == []
untold = Policy(None)
assert sizes(worker(untold, [8, 1, 2, 4])) == [2, 4, 8] and untold.calls == [[1, 2, 4, 8], None]
assert sizes(worker(Policy(None), None)) is None  # graphs off: nothing captured, eager

# the hold: routed by the largest batch of the last N steps; switches counted and logged; 0 is SGLang's routing
assert "self._rig_activate(batch_size)" in ast.get_source_segment(path.read_text(), methods["activate_step_by_batch"])
import collections
logged.clear()
space = load([functions["_rig_hold_steps"], functions["_rig_note_switch"], methods["_rig_activate"]],
             {"_rig_switches": {"count": 0}, "logger": None, "log_info_on_rank0": lambda _, m: logged.append(m)})
for text, steps in (("64", 64), ("0", 0), ("7", 7)):
    space["_RIG_FREE_OFF_HOLD"] = text
    assert space["_rig_hold_steps"]() == (steps, None), text
for text in ("", "-1", "off", "1e3", "\u0661", "1234567"):
    space["_RIG_FREE_OFF_HOLD"] = text
    held, note = space["_rig_hold_steps"]()
    assert held == 64 and "ignored" in note, (text, note)
class Controller:  # SGLang's routing: step 0 from batch 64 up, else 3 steps
    def __init__(self, worker):
        self.worker = worker
    def activate_step_by_batch(self, batch_size):
        self.worker.speculative_num_steps = 0 if batch_size >= 64 else 3
def run(hold, sizes):
    w = types.SimpleNamespace(speculative_num_steps=3, _rig_held=collections.deque(maxlen=hold) if hold else None)
    w.adaptive_controller = Controller(w)
    steps = []
    for bs in sizes:
        space["_rig_activate"](w, bs)
        steps.append(w.speculative_num_steps)
    return steps
ramp = [256] * 3 + [0, 3, 20, 70, 256] + [40] * 8
assert run(0, ramp) == [0] * 3 + [3, 3, 3, 0, 0] + [3] * 8  # SGLang's: drafts through the dip, then below 64
assert space["_rig_switches"]["count"] == 4 and "steps 0 -> 3 at batch 40 (routed as 40); 4 switch(es)" in logged[-1]
space["_rig_switches"]["count"] = 0
# held over 8 steps: the dip stays at step 0; drafting resumes once 8 steps in a row were below 64
assert run(8, ramp) == [0] * 3 + [0] * 5 + [0] * 7 + [3]
assert space["_rig_switches"]["count"] == 2 and "steps 0 -> 3 at batch 40 (routed as 40); 2 switch(es)" in logged[-1]
'''

RUNNER_CHECK = '''import ast
import pathlib

text = pathlib.Path(PATCHED_FILE).read_text()
tree = ast.parse(text)
runner = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "DecodeCudaGraphRunner")
init = next(f for f in runner.body if isinstance(f, ast.FunctionDef) and f.name == "__init__")
body = ast.get_source_segment(text, init)
# the plain-decode branch comes first and leaves the capture mode at DECODE
first = body.index('"rig_plain_decode", False')
assert first < body.index("self.capture_forward_mode = ForwardMode.TARGET_VERIFY")
assert body.index("self.capture_forward_mode = ForwardMode.DECODE") < first
assert "CaptureHiddenMode.FULL" in body[first:body.index("elif model_runner.spec_algorithm.is_speculative():")]
'''


def literal(dumper, text):
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None)


class Dumper(yaml.SafeDumper):
    pass


Dumper.add_representer(str, literal)


def write(doc):
    path = OUT / f"{doc['id']}.yml"
    text = yaml.dump(doc, Dumper=Dumper, sort_keys=False, width=100, allow_unicode=True)
    back = yaml.safe_load(text)
    assert back == doc, f"{path.name} does not read back as written"
    path.write_text(text)
    print("wrote", path)


PROVENANCE_NOTE = ("rig's own change (issue 55): SGLang's adaptive step 0 runs a 1-node TARGET_VERIFY and a "
                   "draft extend every step")

for key, v in VERSIONS.items():
    methods = METHODS
    for name in ("DRAFT_TP_CONTEXT", "READ_DONE_EVENT", "STATIC_EXTRA", "INGEST_EXTRA"):
        methods = methods.replace(f"@@{name}@@", v[name])
    assert "@@" not in methods
    hunks = [{"find": v["module_anchor"],
              "replace": v["module_anchor"].replace(
                  "logger = logging.getLogger(__name__)\n",
                  "logger = logging.getLogger(__name__)\n" + MODULE_BLOCK, 1)}]
    hunks += [
        {"find": INIT_FIND, "replace": INIT_REPLACE},
        {"find": v["step0_find"], "replace": v["step0_replace"]},
        {"find": METHODS_ANCHOR, "replace": methods + METHODS_ANCHOR},
        {"find": ACTIVATE_FIND, "replace": ACTIVATE_REPLACE},
    ]
    write({
        "id": f"sglang-free-off-worker-{key}",
        "summary": (f"adaptive step 0 as a plain decode in the EAGLE v2 worker (sglang {v['version']}), "
                    "opt-in free-off"),
        "package": "sglang",
        "opt_in": "free-off",
        "needed": v["needed"],
        "file": "sglang/srt/speculative/eagle_worker_v2.py",
        "why": ("With adaptive speculation a step-0 batch (no drafting) still runs the target as a 1-node "
                "TARGET_VERIFY (all-true custom mask, full hidden capture, the verify sampler) and then the "
                "draft extend, and reaches 0.31-0.50 of a plain decode server's throughput (issue 55; "
                "docs/validation/tune-h200). Applied (RIG_FREE_OFF=0 in a server's environment turns it off there), "
                "the step-0 batch runs the target in DECODE mode on decode graphs captured at start for the "
                "step-0 batch sizes, samples with the target's sampler and keeps the draft in step "
                "(RIG_FREE_OFF_DRAFT=ingest, the default: the draft layer's KV only, then one repair when "
                "drafting resumes; =extend: SGLang's one-token draft extend). The result has the shape of the "
                "1-node verify, so the scheduler, the relay, the counters and the adaptive controller are "
                "unchanged. Grammar, logprobs, penalties, custom logit processors and requested hidden states "
                "take SGLang's path and are logged. Needs the free-off graphs patch (docs/validation/free-off/DESIGN.md). "
                + v["gpu_runs"]),
        "hunks": hunks,
        "check": WORKER_CHECK,
        "provenance": {
            "mirrors": PROVENANCE_NOTE,
            "fixed_in": "none",
            "checked": f"2026-12-05: anchors and apply/revert on the {v['version']} wheel's file by "
                       "docs/validation/free-off/check_anchors.py; " + v["gpu_checked"],
            "drop_when": "upstream runs adaptive step 0 as a plain decode",
        },
    })

write({
    "id": "sglang-free-off-graphs",
    "summary": ("DecodeCudaGraphRunner captures plain DECODE graphs on a speculative target when its subclass "
                "asks (free-off)"),
    "package": "sglang",
    "opt_in": "free-off",
    # read on 0.5.17 and 0.5.23 only: the versions between are excluded, not assumed
    "needed": ">=0.5.17,<=0.5.23,!=0.5.18.*,!=0.5.19.*,!=0.5.20.*,!=0.5.21.*,!=0.5.22.*",
    "file": "sglang/srt/model_executor/runner/decode_cuda_graph_runner.py",
    "why": ("Under speculation the runner always captures TARGET_VERIFY graphs. The free-off worker patch "
            "builds a subclass with rig_plain_decode = True for the adaptive step-0 batch sizes; for it the "
            "capture mode stays DECODE and the hidden states the draft reads are captured in full. Every "
            "other runner is unchanged (the attribute is absent). The hunk's code is the same on 0.5.17 and "
            "0.5.23."),
    "hunks": [{"find": RUNNER_FIND, "replace": RUNNER_REPLACE}],
    "check": RUNNER_CHECK,
    "provenance": {
        "mirrors": PROVENANCE_NOTE,
        "fixed_in": "none",
        "checked": "2026-12-05: anchors and apply/revert on the 0.5.17 and 0.5.23 wheels' file by "
                   "docs/validation/free-off/check_anchors.py; " + RUN_0517,
        "drop_when": "upstream runs adaptive step 0 as a plain decode",
    },
})
