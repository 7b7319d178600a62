"""Drive a running skein with the real tinker SDK (development-time check; CI replays recorded traffic).

Usage: source <(shared/tools/tinker-sdk-env.sh SDK_GIT_DIR); python3 scripts/sdk_smoke.py http://127.0.0.1:8000
"""
import sys

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
print("SDK SMOKE OK")
