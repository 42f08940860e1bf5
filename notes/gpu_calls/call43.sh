# call 43: the d = 128 backward with dQ under dK (causal) and dividing head groups, the cached
# launch specs: a smoke check, the whole grid (ours and cuDNN), the host split, every attention GPU test
set -u
python3 - <<'PY' || exit 1
import torch, torch.nn.functional as F
from cs336_systems.attention.fast.function import FlashAttentionFast
for (Z, H, N), causal in [((1, 16, 4096), True), ((1, 16, 4096), False), ((1, 32, 2048), False)]:
    q, k, v = (torch.randn(Z, H, N, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn_like(q)
    o = FlashAttentionFast.apply(q, k, v, causal); o.backward(do)
    got = [o, q.grad, k.grad, v.grad]; q.grad = k.grad = v.grad = None
    r = F.scaled_dot_product_attention(q, k, v, is_causal=causal); r.backward(do)
    want = [r, q.grad, k.grad, v.grad]
    errs = [float((a.float() - b.float()).norm() / b.float().norm()) for a, b in zip(got, want)]
    print("smoke", Z, H, N, causal, ["%.1e" % e for e in errs], flush=True)
    assert max(errs) < 2e-2, errs
PY
python3 -m cs336_systems.bench flash-grid --impls cudnn,ours --remeasure || exit 1
python3 notes/host_profile/host_split.py
bash scripts/attention/gpu_tests.sh 300
