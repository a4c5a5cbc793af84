"""MiniMax-M2's q/k norms run over all heads at once (`qk_norm_type = "per_layer"`)."""

from __future__ import annotations

from sim.specs.catalog import load_model


def test_norms_over_all_heads_carry_weights_as_wide_as_q_and_k() -> None:
    minimax, qwen = load_model("MiniMaxAI/MiniMax-M2.5"), load_model("Qwen/Qwen3-32B")
    assert minimax.qk_norm_across_heads and not qwen.qk_norm_across_heads
    h, q, kv = 3072, 48 * 128, 8 * 128
    assert minimax.attention_params() == h * q + 2 * h * kv + q * h + q + kv  # per-head norms: + 2 x 128
    assert qwen.attention_params() == (qwen.hidden_size * qwen.q_width() + 2 * qwen.hidden_size * qwen.kv_width()
                                       + qwen.q_width() * qwen.hidden_size + 2 * qwen.head_dim)
