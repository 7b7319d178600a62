"""Drive a running skein with the real tinker SDK (development-time check; CI replays recorded traffic).

Usage: source <(shared/tools/tinker-sdk-env.sh SDK_GIT_DIR); python3 scripts/sdk_smoke.py http://127.0.0.1:8000
The DPO part (forward_backward_custom) needs torch; without it that part is skipped.
"""
import datetime
import json
import subprocess
import sys
import tempfile
import urllib.request

import tinker
from tinker import types

base_url = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000"
sc = tinker.ServiceClient(base_url=base_url, api_key="tml-sdk-smoke")
caps = sc.get_server_capabilities()
model = caps.supported_models[0].model_name
print("capabilities:", caps)

tc = sc.create_lora_training_client(base_model=model, rank=8)
toks = [10, 20, 30, 40, 50, 60, 70, 80]
datum = types.Datum(
    model_input=types.ModelInput.from_ints(toks[:-1]),
    loss_fn_inputs={"target_tokens": toks[1:], "weights": [1.0] * (len(toks) - 1)},
)
losses = []
for step in range(8):
    fb = tc.forward_backward([datum], "cross_entropy")
    opt = tc.optim_step(types.AdamParams(learning_rate=1e-2))
    out = fb.result()
    opt.result()
    losses.append(out.metrics["loss:sum"])
print("losses:", [round(x, 3) for x in losses])
assert losses[-1] < losses[0] / 2, losses

rl = types.Datum(
    model_input=types.ModelInput.from_ints(toks[:-1]),
    loss_fn_inputs={"target_tokens": toks[1:], "logprobs": [-1.0] * 7, "advantages": [0.5] * 7},
)
for loss in ["importance_sampling", "ppo", "cispo", "dro"]:
    r = tc.forward_backward([rl], loss).result()
    print(loss, r.metrics)
tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()
fwd = tc.forward([datum], "cross_entropy").result()
print("forward logprobs:", fwd.loss_fn_outputs[0]["logprobs"].tolist()[:3])

info = tc.get_info()
print("info:", info)
state = tc.save_state("ckpt1").result()
print("save_state:", state.path)
sampler_path = tc.save_weights_for_sampler("s1").result().path
print("sampler path:", sampler_path)

sampling = tc.save_weights_and_get_sampling_client()
res = sampling.sample(types.ModelInput.from_ints([1, 2, 3]), num_samples=2,
                      sampling_params=types.SamplingParams(max_tokens=5, seed=3, temperature=1.0)).result()
for s in res.sequences:
    print("sample:", s.tokens, s.logprobs, s.stop_reason)
    assert len(s.logprobs) == len(s.tokens)
lp = sampling.compute_logprobs(types.ModelInput.from_ints([1, 2, 3, 4])).result()
print("compute_logprobs:", lp)
assert lp[0] is None and len(lp) == 4

named = sc.create_sampling_client(model_path=sampler_path)
print("named sampler:", named.sample(types.ModelInput.from_ints([5]), num_samples=1,
                                     sampling_params=types.SamplingParams(max_tokens=2, stop=[7], seed=1)).result())
base = sc.create_sampling_client(base_model=model)
print("base sampler:", base.sample(types.ModelInput.from_ints([5]), num_samples=1,
                                   sampling_params=types.SamplingParams(max_tokens=2, seed=2)).result())

tc2 = sc.create_training_client_from_state_with_optimizer(state.path)
r2 = tc2.forward([datum], "cross_entropy").result()
assert r2.loss_fn_outputs[0]["logprobs"].tolist() == fwd.loss_fn_outputs[0]["logprobs"].tolist()
print("resumed forward:", r2.metrics)

rc = sc.create_rest_client()
cks = rc.list_checkpoints(tc.model_id).result()
print("checkpoints:", [c.checkpoint_id for c in cks.checkpoints])
runs = rc.list_training_runs().result()
print("training runs:", len(runs.training_runs))
rc.delete_checkpoint_from_tinker_path(sampler_path).result()
print("after delete:", [c.checkpoint_id for c in rc.list_checkpoints(tc.model_id).result().checkpoints])

# --- the whole surface: projects, scopes, audit, billing, traces, checkpoints, sampling rules ---
session_id = sc.holder.get_session_id()
rc.assign_session_project(session_id, "smoke-project").result()
in_project = rc.list_training_runs(project_id="smoke-project").result()
print("runs in project:", len(in_project.training_runs))
assert tc.model_id in [r.training_run_id for r in in_project.training_runs]
assert rc.list_training_runs(project_id="no-such-project").result().training_runs == []
rc.publish_checkpoint_from_tinker_path(state.path).result()
other_sc = tinker.ServiceClient(base_url=base_url, api_key="tml-sdk-smoke-other", project_id="other-project",
                               user_metadata={"team": "b"})
other = other_sc.create_rest_client()
visible = [r.training_run_id for r in other.list_training_runs(access_scope="accessible").result().training_runs]
print("accessible to another tenant:", visible)
assert tc.model_id in visible and tc.model_id not in [r.training_run_id for r in other.list_training_runs().result().training_runs]
assert other.get_training_run(tc.model_id, access_scope="accessible").result().training_run_id == tc.model_id
other_tc = other_sc.create_lora_training_client(base_model=model, rank=4)  # created in its session's project
assert [r.training_run_id for r in other.list_training_runs(project_id="other-project").result().training_runs] == [other_tc.model_id]
other_tc.forward_backward([datum], "cross_entropy").result()

meta_tc = sc.create_lora_training_client(base_model=model, rank=4, user_metadata={"experiment": "smoke"})
first = meta_tc.save_state("first").result().path
second = meta_tc.save_state("second").result().path
run = rc.get_training_run(meta_tc.model_id).result()
assert run.user_metadata == {"experiment": "smoke"}, run.user_metadata
assert run.last_checkpoint.tinker_path == second, run.last_checkpoint
rc.delete_checkpoint_from_tinker_path(second).result()
run = rc.get_training_run(meta_tc.model_id).result()
print("last checkpoint after deleting the newest:", run.last_checkpoint.tinker_path)
assert run.last_checkpoint.tinker_path == first
try:
    meta_tc.load_state(second).result()
    raise AssertionError("loading a deleted checkpoint succeeded")
except tinker.NotFoundError as e:
    print("load_state of a deleted checkpoint: 404", e.status_code)

greedy = [base.sample(types.ModelInput.from_ints([5, 6]), num_samples=1,
                      sampling_params=types.SamplingParams(max_tokens=4, top_p=0.0, seed=seed)).result().sequences[0].tokens
          for seed in range(3)]
argmax = base.sample(types.ModelInput.from_ints([5, 6]), num_samples=1,
                     sampling_params=types.SamplingParams(max_tokens=4, temperature=0.0)).result().sequences[0].tokens
print("top_p=0:", greedy, "temperature 0:", argmax)
assert all(g == argmax for g in greedy)

# twinkle's reference logprobs: the same run with the adapter switched off.
ref = tc.forward([datum], "cross_entropy", loss_fn_config={"disable_lora": True}).result()
base_lp = meta_tc.forward([datum], "cross_entropy").result()  # untrained since its last load: still the base model
ref_lp = ref.loss_fn_outputs[0]["logprobs"].tolist()
print("reference logprobs (disable_lora):", [round(x, 4) for x in ref_lp[:3]])
assert all(abs(a - b) < 1e-4 for a, b in zip(ref_lp, base_lp.loss_fn_outputs[0]["logprobs"].tolist()))
try:
    tc.forward_backward([datum], "cross_entropy", loss_fn_config={"disable_lora": True}).result()
    raise AssertionError("forward_backward took disable_lora")
except tinker.BadRequestError as e:
    print("forward_backward with disable_lora: 400")

# DPO with forward_backward_custom, as the cookbook's preference recipes do: reference logprobs
# from the base model (disable_lora), the policy's from the custom loss's forward.
try:
    import torch
except ImportError:
    torch = None
if torch is not None:
    dpo = sc.create_lora_training_client(base_model=model, rank=8)
    prompt = [11, 12, 13]
    chosen, rejected = [21, 22, 23, 24], [31, 32, 33, 34]

    def pair_datum(completion):
        full = prompt + completion
        w = [0.0] * (len(prompt) - 1) + [1.0] * len(completion)
        return types.Datum(model_input=types.ModelInput.from_ints(full[:-1]),
                           loss_fn_inputs={"target_tokens": full[1:], "weights": w})

    pair = [pair_datum(chosen), pair_datum(rejected)]
    ref_out = dpo.forward(pair, "cross_entropy", loss_fn_config={"disable_lora": True}).result()
    ref_lps = [torch.tensor(o["logprobs"].tolist()) for o in ref_out.loss_fn_outputs]
    weights = [torch.tensor(d.loss_fn_inputs["weights"].tolist()) for d in pair]

    def dpo_loss(data, logprobs):
        margin = [((lp - r) * w).sum() for lp, r, w in zip(logprobs, ref_lps, weights)]
        loss = -torch.nn.functional.logsigmoid(0.1 * (margin[0] - margin[1]))
        return loss, {"dpo_loss": loss.item(), "margin": (margin[0] - margin[1]).item()}

    dpo_losses = []
    for _ in range(6):
        out = dpo.forward_backward_custom(pair, dpo_loss).result()
        dpo.optim_step(types.AdamParams(learning_rate=2e-2)).result()
        dpo_losses.append(out.metrics["dpo_loss"])
    print("dpo losses:", [round(x, 4) for x in dpo_losses])
    assert dpo_losses[-1] < dpo_losses[0], dpo_losses

audit = rc.get_audit_log().result()
print("audit:", [(e.event, e.tinker_path) for e in audit.entries][-4:])
assert {"training_run.create", "checkpoint.save", "checkpoint.delete", "checkpoint.publish"} <= {e.event for e in audit.entries}
assert all(e.event.startswith("checkpoint.") for e in rc.get_audit_log(event_type="checkpoints").result().entries)

hour = datetime.datetime.now(datetime.timezone.utc).replace(minute=0, second=0, microsecond=0)
usage = rc.get_billing_usage(hour - datetime.timedelta(hours=1), hour + datetime.timedelta(hours=1)).result()
kinds = {e.event_info.type for e in usage.data}
print("billing kinds:", sorted(kinds), "sessions:", len(usage.sessions))
assert {"training", "sampling_prefill", "sampling_sample", "checkpoint", "storage"} <= kinds
other_usage = other.get_billing_usage(hour - datetime.timedelta(hours=1), hour + datetime.timedelta(hours=1)).result()
print("another tenant's usage:", [(e.event_info.type, e.project_id) for e in other_usage.data], other_usage.sessions)
assert [e.project_id for e in other_usage.data if e.event_info.type == "training"] == ["other-project"]
assert [s.user_metadata for s in other_usage.sessions.values()] == [{"team": "b"}]

url = rc.export_session_trace(session_id).result()
with urllib.request.urlopen(url) as resp:
    trace = json.loads(resp.read())
print("trace events:", len(trace["traceEvents"]))
assert any(e["name"] == "ForwardBackward" for e in trace["traceEvents"])

# The SDK's CLI: session export-trace and billing usage.
env = {"TINKER_BASE_URL": base_url, "TINKER_API_KEY": "tml-sdk-smoke"}
import os
env = {**os.environ, **env}
with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "s.pftrace")
    subprocess.run([sys.executable, "-m", "tinker.cli", "session", "export-trace", session_id, "--output", out],
                   env=env, check=True)
    assert json.load(open(out))["traceEvents"]
cli = subprocess.run([sys.executable, "-m", "tinker.cli", "--format", "json", "billing", "usage",
                      (hour - datetime.timedelta(hours=1)).isoformat(), (hour + datetime.timedelta(hours=1)).isoformat()],
                     env=env, check=True, capture_output=True, text=True)
print("cli billing usage:", cli.stdout[:120].replace("\n", " "))
print("SDK SMOKE OK")
