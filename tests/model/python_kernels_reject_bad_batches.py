"""python/asynct's decode and prefill check a batch's block table and lengths against the cache
before the kernels (which trust them) run: a valid batch runs, and each bad one is a KernelError
that names what is wrong, with nothing launched.

Needs PyTorch and a CUDA build of libasynct.so (CTest label "torch"; not part of CI).
Usage: python3 tests/model/python_kernels_reject_bad_batches.py
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import asynct  # noqa: E402

HQ, HKV, D, BS = 4, 2, 128, 16


def expect_error(fragment, fn):
    try:
        fn()
    except asynct.KernelError as e:
        assert fragment in str(e), f"expected '{fragment}' in: {e}"
        print(f"ok: {e}")
        return
    raise AssertionError(f"no error; expected one mentioning '{fragment}'")


def main():
    torch.manual_seed(0)
    dev = "cuda"
    nb = 8
    key_cache = torch.randn(nb, BS, HKV, D, device=dev, dtype=torch.bfloat16)
    value_cache = torch.randn_like(key_cache)
    table = torch.tensor([[3, 5, -1], [0, 1, 2]], device=dev, dtype=torch.int32)
    kv_lens = torch.tensor([20, 40], device=dev, dtype=torch.int32)
    q = torch.randn(2, HQ, D, device=dev, dtype=torch.bfloat16)
    gate = asynct.Gate.softmax()
    good = asynct.decode(q, key_cache, value_cache, table, kv_lens, gate)
    assert torch.isfinite(good.float()).all()
    print("ok: a valid decode batch runs")

    bad = table.clone()
    bad[1, 2] = nb
    expect_error("block_table[1][2] = 8", lambda: asynct.decode(q, key_cache, value_cache, bad, kv_lens, gate))
    long = torch.tensor([20, 49], device=dev, dtype=torch.int32)
    expect_error("sequence 1 has kv_len 49", lambda: asynct.decode(q, key_cache, value_cache, table, long, gate,
                                                                   max_kv_len=48))
    expect_error("max_kv_len 49 outside 1..48", lambda: asynct.decode(q, key_cache, value_cache, table, long, gate))
    expect_error("kv_lens has 1 entries", lambda: asynct.decode(q, key_cache, value_cache, table, kv_lens[:1], gate))

    # Prefill: sequence 0 adds 4 tokens to 16 cached ones, sequence 1 all 40 of its tokens.
    cu = torch.tensor([0, 4, 44], device=dev, dtype=torch.int32)
    qp = torch.randn(44, HQ, D, device=dev, dtype=torch.bfloat16)
    kp = torch.randn(44, HKV, D, device=dev, dtype=torch.bfloat16)
    vp = torch.randn_like(kp)
    out = asynct.prefill(qp, kp, vp, key_cache, value_cache, table, cu, kv_lens, gate, max_q_len=40, max_kv_len=40)
    assert torch.isfinite(out.float()).all()
    print("ok: a valid prefill batch runs")
    expect_error("above max_q_len 39", lambda: asynct.prefill(qp, kp, vp, key_cache, value_cache, table, cu, kv_lens,
                                                              gate, max_q_len=39, max_kv_len=40))
    wrong = torch.tensor([0, 4, 43], device=dev, dtype=torch.int32)
    expect_error("not at the 44 query rows", lambda: asynct.prefill(qp, kp, vp, key_cache, value_cache, table, wrong,
                                                                    kv_lens, gate, max_q_len=40, max_kv_len=40))
    torch.cuda.synchronize()  # nothing bad was launched: the context is healthy
    print("all checks passed")


if __name__ == "__main__":
    main()
