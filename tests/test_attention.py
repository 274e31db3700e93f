"""Multi-head attention against the paper's formulas, written independently in NumPy."""

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import MultiHeadAttention, causal_mask, padding_mask
from keras_transformer.attention import ELEMENTWISE_MAX_ROWS
from trainer.training.precision import bfloat16_instructions

# Where the CPU has bfloat16 units (AVX-512 BF16, AMX), oneDNN computes bfloat16 matmuls and
# rounds each output once; elsewhere (AVX2) TensorFlow's own kernels round another way,
# which a sentence's batch can change by a bfloat16 ulp or two (73% of these outputs on an
# AMD EPYC with AVX2 only).
BFLOAT16_UNITS = bfloat16_instructions()


def numpy_softmax(x):
    x = x - x.max(axis=-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=-1, keepdims=True)


def numpy_multi_head(query, value, weights, num_heads, mask=None):
    """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O, head_i = softmax(Q_i K_i^T / sqrt(d_k)) V_i,
    computed head by head with explicit per-head weight slices (section 3.2.2)."""
    (wq, bq), (wk, bk), (wv, bv), (wo, bo) = weights
    d_k = wq.shape[1] // num_heads
    d_v = wv.shape[1] // num_heads
    heads = []
    for i in range(num_heads):
        q = query @ wq[:, i * d_k:(i + 1) * d_k] + bq[i * d_k:(i + 1) * d_k]
        k = value @ wk[:, i * d_k:(i + 1) * d_k] + bk[i * d_k:(i + 1) * d_k]
        v = value @ wv[:, i * d_v:(i + 1) * d_v] + bv[i * d_v:(i + 1) * d_v]
        scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(d_k)  # [batch, q_len, k_len]
        if mask is not None:
            scores = np.where(mask, scores, -np.inf)
        heads.append(numpy_softmax(scores) @ v)
    return np.concatenate(heads, axis=-1) @ wo + bo


def layer_weights(mha):
    return [(d.kernel.numpy(), d.bias.numpy())
            for d in (mha.query_dense, mha.key_dense, mha.value_dense, mha.output_dense)]


@pytest.mark.parametrize("num_heads,key_dim,value_dim", [(4, None, None), (2, 8, 24)])
def test_cross_attention_equals_numpy_reference(num_heads, key_dim, value_dim):
    rng = np.random.default_rng(0)
    query = rng.normal(size=(3, 5, 32)).astype("float32")
    value = rng.normal(size=(3, 7, 32)).astype("float32")
    ids = np.array([[1] * 7, [1] * 4 + [0] * 3, [1] * 2 + [0] * 5])
    mha = MultiHeadAttention(num_heads=num_heads, d_model=32, key_dim=key_dim,
                             value_dim=value_dim)
    got = mha(query, value, attention_mask=padding_mask(ids)).numpy()
    expected = numpy_multi_head(query, value, layer_weights(mha), num_heads,
                                mask=(ids != 0)[:, None, :])
    assert got.shape == (3, 5, 32)
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_causal_self_attention_equals_numpy_reference():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2, 6, 16)).astype("float32")
    mha = MultiHeadAttention(num_heads=4, d_model=16)
    got = mha(x, x, attention_mask=causal_mask(6)).numpy()
    mask = np.tril(np.ones((6, 6), bool))[None]
    np.testing.assert_allclose(got, numpy_multi_head(x, x, layer_weights(mha), 4, mask),
                               atol=1e-5)


def test_attention_weights_are_float32_distributions_under_mixed_precision():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(2, 5, 16)).astype("float32")
    ids = np.array([[1, 1, 1, 0, 0], [1] * 5])
    mha = MultiHeadAttention(num_heads=2, d_model=16, dtype="mixed_float16")
    out, weights = mha(x, x, attention_mask=padding_mask(ids), return_attention_scores=True)
    assert out.dtype == "float16" and weights.dtype == "float32"
    weights = weights.numpy()
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
    assert np.all(weights[0, :, :, 3:] == 0.0), "padded keys must get exactly zero weight"


def test_d_model_not_divisible_by_heads_is_an_error():
    with pytest.raises(ValueError, match="divisible"):
        MultiHeadAttention(num_heads=3, d_model=16)


@pytest.mark.parametrize("dtype", ["float32", "mixed_bfloat16"])
def test_a_decoding_step_answers_each_sentence_as_it_would_alone(dtype):
    """A step of more than ELEMENTWISE_MAX_ROWS rows attends with batched matmuls, a smaller
    one with elementwise ops: both must give full attention's answer, and a sentence's
    answer must not depend on the batch it came in (bfloat16 on a CPU with bfloat16 units:
    rounded as the matmuls round; without that rounding, half of the outputs differed;
    elsewhere within two bfloat16 ulps). A search that knows its
    steps' side of the limit makes the choice once (`elementwise`): the same ops, so the
    same bits as the choice made at the step."""
    rng = np.random.default_rng(4)
    sentences, beams, d_model, past = 5, 4, 32, 6
    assert sentences * beams > ELEMENTWISE_MAX_ROWS >= beams
    rows = sentences * beams
    x = rng.normal(size=(rows, d_model)).astype("float32")
    history = rng.normal(size=(rows, past, d_model)).astype("float32")
    memory = rng.normal(size=(sentences, 7, d_model)).astype("float32")
    ids = (np.arange(7) < rng.integers(1, 8, size=(sentences, 1))).astype("int32")
    self_mha = MultiHeadAttention(num_heads=4, d_model=d_model, dtype=dtype)
    cross_mha = MultiHeadAttention(num_heads=4, d_model=d_model, dtype=dtype)
    sequence = np.concatenate([history, x[:, None]], axis=1)
    full = {"self": self_mha(sequence, sequence, attention_mask=causal_mask(past + 1))[:, -1],
            "cross": tf.reshape(cross_mha(x.reshape(sentences, beams, d_model), memory,
                                          attention_mask=padding_mask(ids)), [rows, d_model])}
    compute = self_mha.compute_dtype
    history_kv = self_mha.project_key_value(tf.cast(history, compute))
    memory_kv = cross_mha.project_key_value(tf.cast(memory, compute))

    def step(sentence_slice, elementwise=None):
        row_slice = slice(sentence_slice.start * beams, sentence_slice.stop * beams)
        x_rows = tf.cast(x[row_slice], compute)
        return {"self": self_mha.self_attention_step(
                    x_rows, *(t[row_slice] for t in history_kv),
                    self_mha.step_weights(self_attention=True, elementwise=elementwise))[0],
                "cross": cross_mha.cross_attention_step(
                    x_rows, *(t[sentence_slice] for t in memory_kv),
                    padding_mask(ids[sentence_slice]),
                    cross_mha.step_weights(self_attention=False, elementwise=elementwise))}

    together = step(slice(0, sentences))
    alone = [step(slice(i, i + 1)) for i in range(sentences)]
    together_once = step(slice(0, sentences), elementwise=False)
    alone_once = [step(slice(i, i + 1), elementwise=True) for i in range(sentences)]
    for kind in ("self", "cross"):
        assert np.array_equal(together_once[kind], together[kind]), kind
        for a, b in zip(alone_once, alone):
            assert np.array_equal(a[kind], b[kind]), kind
        batched = tf.cast(together[kind], tf.float32).numpy()
        single = np.concatenate([tf.cast(a[kind], tf.float32).numpy() for a in alone])
        if dtype == "float32":
            np.testing.assert_allclose(batched, full[kind], atol=1e-5)
            np.testing.assert_allclose(single, full[kind], atol=1e-5)
            np.testing.assert_allclose(single, batched, atol=1e-6)
        else:
            np.testing.assert_allclose(batched, tf.cast(full[kind], tf.float32), atol=0.1)
            if BFLOAT16_UNITS:
                assert np.mean(single != batched) <= 0.01, kind
            else:  # Eigen's bfloat16 matmul, not oneDNN's: its rounding is its own
                np.testing.assert_allclose(single, batched, rtol=2 ** -6, atol=2 ** -6)
