import numpy as np
import pytest
import torch

from sklocus.nn import (
    AttentionBlock,
    AttentionPooling,
    CorrectnessPredictor,
    EvaluationTokenizer,
    LatentBottleneckLayer,
    LocusNetwork,
    MultiHeadAttention,
    SetEncoder,
)
from sklocus.nn.batching import pad, size_buckets

BATCH, N, DIM, QUERY_DIM = 3, 7, 16, 12


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _tokens_and_mask():
    tokens = torch.randn(BATCH, N, DIM)
    mask = torch.ones(BATCH, N, dtype=torch.bool)
    mask[1, 4:] = False
    mask[2, 1:] = False
    return tokens, mask


def _scramble_padding(tensor, mask):
    """Replace every padded row with large random values."""
    noisy = tensor.clone()
    noisy[~mask] = 100 * torch.randn_like(noisy[~mask])
    return noisy


def test_multi_head_attention_shape_and_masking():
    attention = MultiHeadAttention(DIM, n_heads=4).eval()
    tokens, mask = _tokens_and_mask()
    queries = torch.randn(BATCH, 5, DIM)
    out = attention(queries, tokens, mask)
    assert out.shape == (BATCH, 5, DIM)
    torch.testing.assert_close(
        attention(queries, _scramble_padding(tokens, mask), mask), out
    )
    # Padding is the same as leaving the padded keys out.
    torch.testing.assert_close(
        attention(queries[1:2], tokens[1:2, :4]), out[1:2], atol=1e-6, rtol=1e-5
    )


def test_multi_head_attention_rejects_heads_that_do_not_divide():
    with pytest.raises(ValueError, match="n_heads=3 must divide the width 16"):
        MultiHeadAttention(16, 3)


def test_attention_block_shape_and_masking():
    block = AttentionBlock(DIM, n_heads=2).eval()
    tokens, mask = _tokens_and_mask()
    queries = torch.randn(BATCH, 4, DIM)
    out = block(queries, tokens, mask)
    assert out.shape == (BATCH, 4, DIM)
    torch.testing.assert_close(
        block(queries, _scramble_padding(tokens, mask), mask), out
    )


def test_latent_bottleneck_shape_and_masking():
    layer = LatentBottleneckLayer(DIM, n_latents=5, n_heads=2).eval()
    tokens, mask = _tokens_and_mask()
    out = layer(tokens, mask)
    assert out.shape == (BATCH, N, DIM)
    scrambled = layer(_scramble_padding(tokens, mask), mask)
    torch.testing.assert_close(scrambled[mask], out[mask])


def test_attention_pooling_shape_and_masking():
    pooling = AttentionPooling(DIM, n_heads=2).eval()
    tokens, mask = _tokens_and_mask()
    out = pooling(tokens, mask)
    assert out.shape == (BATCH, DIM)
    torch.testing.assert_close(pooling(_scramble_padding(tokens, mask), mask), out)


def test_tokenizer_shape_and_sign_of_the_score():
    tokenizer = EvaluationTokenizer(QUERY_DIM, DIM)
    vectors = torch.randn(BATCH, N, QUERY_DIM)
    scores = torch.randint(0, 2, (BATCH, N)).float()
    assert tokenizer(vectors, scores).shape == (BATCH, N, DIM)
    # Tokens are per evaluation: one evaluation's token ignores the others.
    torch.testing.assert_close(
        tokenizer(vectors[:, :1], scores[:, :1]), tokenizer(vectors, scores)[:, :1]
    )
    assert not torch.allclose(
        tokenizer(vectors, scores), tokenizer(vectors, 1 - scores)
    )


def _set_batch():
    vectors = torch.randn(BATCH, N, QUERY_DIM)
    scores = torch.randint(0, 2, (BATCH, N)).float()
    _, mask = _tokens_and_mask()
    return vectors, scores, mask


def test_set_encoder_shape_masking_and_permutation_invariance():
    encoder = SetEncoder(QUERY_DIM, DIM, n_latents=4, n_layers=2, n_heads=2).eval()
    vectors, scores, mask = _set_batch()
    z = encoder(vectors, scores, mask)
    assert z.shape == (BATCH, DIM)
    padded_vectors = _scramble_padding(vectors, mask)
    padded_scores = torch.where(mask, scores, torch.full_like(scores, 0.5))
    torch.testing.assert_close(encoder(padded_vectors, padded_scores, mask), z)
    order = torch.randperm(N)
    torch.testing.assert_close(
        encoder(vectors[:, order], scores[:, order], mask[:, order]),
        z,
        atol=1e-5,
        rtol=0,
    )
    # A set alone gives the same embedding as in a padded batch.
    alone = encoder(vectors[1:2, :4], scores[1:2, :4])
    torch.testing.assert_close(alone, z[1:2], atol=1e-5, rtol=0)


def test_predictor_shape_and_pairwise_equals_forward():
    predictor = CorrectnessPredictor(QUERY_DIM, DIM, hidden=8).eval()
    z = torch.randn(4, DIM)
    queries = torch.randn(6, QUERY_DIM)
    pairwise = predictor.pairwise(z, queries)
    assert pairwise.shape == (4, 6)
    straight = predictor(z, queries.expand(4, -1, -1))
    torch.testing.assert_close(pairwise, straight, atol=1e-5, rtol=1e-5)
    # Each query's logit is its own: masking (dropping) other queries changes nothing.
    torch.testing.assert_close(
        predictor(z, queries[None, :2].expand(4, -1, -1)), straight[:, :2]
    )


def test_network_shape_and_masking():
    network = LocusNetwork(QUERY_DIM, embedding_dim=DIM, n_latents=4, n_heads=2).eval()
    vectors, scores, mask = _set_batch()
    decoder = torch.randn(BATCH, 5, QUERY_DIM)
    logits = network(vectors, scores, mask, decoder)
    assert logits.shape == (BATCH, 5)
    torch.testing.assert_close(
        network(_scramble_padding(vectors, mask), scores, mask, decoder), logits
    )


def test_network_adds_query_noise_only_in_training():
    network = LocusNetwork(
        QUERY_DIM, embedding_dim=DIM, n_latents=4, n_heads=2, dropout=0
    )
    network.query_noise = 0.1
    vectors, scores, mask = _set_batch()
    decoder = torch.randn(BATCH, 5, QUERY_DIM)
    network.eval()
    torch.testing.assert_close(
        network(vectors, scores, mask, decoder), network(vectors, scores, mask, decoder)
    )
    network.train()
    assert not torch.allclose(
        network(vectors, scores, mask, decoder), network(vectors, scores, mask, decoder)
    )


def test_pad_and_size_buckets():
    values, mask = pad([np.array([1, 2, 3]), np.array([4])], 0, torch.long)
    assert values.tolist() == [[1, 2, 3], [4, 0, 0]]
    assert mask.tolist() == [[True, True, True], [True, False, False]]
    sizes = np.array([5, 1, 100, 5, 2])
    batches = size_buckets(sizes, max_tokens=12, max_sets=2)
    assert [b.tolist() for b in batches] == [[1, 4], [0, 3], [2]]
    assert sorted(np.concatenate(batches).tolist()) == list(range(5))


def test_collator_keeps_validation_queries_out_of_training():
    from sklocus.evaluations import check_evaluation_sets
    from sklocus.nn.training import SetCollator

    sets = [{f"q{j}": float(j % 2) for j in range(40)} for _ in range(3)]
    ragged = check_evaluation_sets(sets)
    vectors = np.eye(40, dtype=np.float32)  # row j identifies query code j
    query_mask = np.ones(40, dtype=bool)
    query_mask[[3, 7, 11]] = False
    common = (ragged, vectors, (4, 16), 8, 0)
    training = SetCollator(*common, query_mask=query_mask)
    for _ in range(5):
        inputs, targets = training([(0, 0), (1, 0), (2, 0)])
        used = inputs["encoder_vectors"][inputs["encoder_mask"]].argmax(-1)
        assert not set(used.tolist()) & {3, 7, 11}
        decoded = inputs["decoder_vectors"][~torch.isnan(targets)].argmax(-1)
        assert not set(decoded.tolist()) & {3, 7, 11}
    validation = SetCollator(*common, fixed=True, query_mask=query_mask)
    inputs, targets = validation([(0, 0), (1, 1)])
    used = inputs["encoder_vectors"][inputs["encoder_mask"]].argmax(-1)
    assert not set(used.tolist()) & {3, 7, 11}
    for row in range(2):
        decoded = inputs["decoder_vectors"][row][~torch.isnan(targets[row])].argmax(-1)
        assert sorted(decoded.tolist()) == [3, 7, 11]
    again, _ = validation([(1, 1), (0, 0)])
    torch.testing.assert_close(
        again["encoder_vectors"][1], inputs["encoder_vectors"][0]
    )
