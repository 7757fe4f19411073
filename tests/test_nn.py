import numpy as np
import pytest
import torch
from vectors import assert_same_vectors

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
from sklocus.nn.batching import pad, padded_width, size_buckets

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


def test_one_shared_query_equals_the_straightforward_block():
    block = AttentionBlock(DIM, n_heads=2).eval()
    with torch.no_grad():  # non-zero biases, so that folding them must be right
        block.attention.to_key_value.bias.normal_()
    tokens, mask = _tokens_and_mask()
    query = torch.randn(DIM)
    straight = block(query.expand(BATCH, 1, DIM), tokens, mask)[:, 0]
    torch.testing.assert_close(
        block.one_query(query, tokens, mask), straight, atol=1e-5, rtol=1e-5
    )
    torch.testing.assert_close(
        block.one_query(query, tokens),
        block(query.expand(BATCH, 1, DIM), tokens)[:, 0],
        atol=1e-5,
        rtol=1e-5,
    )


def test_attention_pooling_shape_and_masking():
    pooling = AttentionPooling(DIM, n_heads=2).eval()
    tokens, mask = _tokens_and_mask()
    out = pooling(tokens, mask)
    assert out.shape == (BATCH, DIM)
    torch.testing.assert_close(pooling(_scramble_padding(tokens, mask), mask), out)


def _coded(vectors):
    """A query table with one row per (set, evaluation) and the codes into it."""
    batch, n, width = vectors.shape
    return vectors.reshape(batch * n, width), torch.arange(batch * n).view(batch, n)


def _straightforward_tokens(tokenizer, vectors, scores):
    """The tokenizer MLP applied to every evaluation's full feature vector."""
    scores = scores.unsqueeze(-1)
    features = torch.cat([vectors, scores, vectors * (2 * scores - 1)], dim=-1)
    return tokenizer.mlp(features)


def test_tokenizer_equals_the_straightforward_computation():
    tokenizer = EvaluationTokenizer(QUERY_DIM, DIM)
    vectors = torch.randn(BATCH, N, QUERY_DIM)
    scores = torch.randint(0, 2, (BATCH, N)).float()
    table, codes = _coded(vectors)
    tokens = tokenizer(tokenizer.project_queries(table), codes, scores)
    assert tokens.shape == (BATCH, N, DIM)
    expected = _straightforward_tokens(tokenizer, vectors, scores)
    torch.testing.assert_close(tokens, expected, atol=1e-5, rtol=1e-5)
    # Fractional scores (majority ties, means) too: the first layer is linear in y.
    halves = torch.full((BATCH, N), 0.5)
    torch.testing.assert_close(
        tokenizer(tokenizer.project_queries(table), codes, halves),
        _straightforward_tokens(tokenizer, vectors, halves),
        atol=1e-5,
        rtol=1e-5,
    )
    # Shared queries: a table of distinct queries gives the same tokens.
    distinct = torch.randn(3, QUERY_DIM)
    shared = torch.randint(0, 3, (BATCH, N))
    torch.testing.assert_close(
        tokenizer(tokenizer.project_queries(distinct), shared, scores),
        _straightforward_tokens(tokenizer, distinct[shared], scores),
        atol=1e-5,
        rtol=1e-5,
    )
    assert not torch.allclose(
        tokens, tokenizer(tokenizer.project_queries(table), codes, 1 - scores)
    )


def _set_batch():
    vectors = torch.randn(BATCH, N, QUERY_DIM)
    scores = torch.randint(0, 2, (BATCH, N)).float()
    _, mask = _tokens_and_mask()
    return vectors, scores, mask


@pytest.mark.parametrize("prior_tokens", [0, 2])
def test_set_encoder_shape_masking_and_permutation_invariance(prior_tokens):
    encoder = SetEncoder(
        QUERY_DIM, DIM, n_latents=4, n_layers=2, n_heads=2, prior_tokens=prior_tokens
    ).eval()
    vectors, scores, mask = _set_batch()
    z = encoder(*_coded(vectors), scores, mask)
    assert z.shape == (BATCH, DIM)
    padded_vectors = _scramble_padding(vectors, mask)
    padded_scores = torch.where(mask, scores, torch.full_like(scores, 0.5))
    torch.testing.assert_close(encoder(*_coded(padded_vectors), padded_scores, mask), z)
    order = torch.randperm(N)
    table, codes = _coded(vectors)
    torch.testing.assert_close(
        encoder(table, codes[:, order], scores[:, order], mask[:, order]),
        z,
        atol=1e-5,
        rtol=0,
    )
    # So does permuting the rows of the query table along with the codes.
    rows = torch.randperm(len(table))
    torch.testing.assert_close(
        encoder(table[rows], torch.argsort(rows)[codes], scores, mask),
        z,
        atol=1e-5,
        rtol=0,
    )
    # A set alone gives the same embedding as in a padded batch.
    alone = encoder(*_coded(vectors[1:2, :4]), scores[1:2, :4])
    torch.testing.assert_close(alone, z[1:2], atol=1e-5, rtol=0)


def test_prior_tokens_let_the_encoder_tell_how_much_evidence_it_has():
    # Attention only averages: without prior tokens, a set and the same set with
    # every evaluation repeated twice (the same rates from twice the evidence)
    # embed identically. A learned prior token's share of each softmax shrinks
    # as the set grows, so with one they differ.
    vectors, scores, _ = _set_batch()
    table, codes = _coded(vectors)
    doubled = (table, codes.repeat(1, 2), scores.repeat(1, 2))
    for prior_tokens in (0, 1):
        torch.manual_seed(0)
        encoder = SetEncoder(
            QUERY_DIM,
            DIM,
            n_latents=4,
            n_layers=2,
            n_heads=2,
            prior_tokens=prior_tokens,
        ).eval()
        with torch.no_grad():
            encoder.prior.normal_()  # as after training, not near zero
        once, twice = encoder(table, codes, scores), encoder(*doubled)
        gap = (once - twice).norm(dim=1) / once.norm(dim=1)
        if prior_tokens:
            assert gap.min() > 1e-3
        else:
            assert gap.max() < 1e-5


def test_predictor_shape_and_pairwise_equals_forward():
    predictor = CorrectnessPredictor(QUERY_DIM, DIM, hidden=8).eval()
    z = torch.randn(4, DIM)
    queries = torch.randn(6, QUERY_DIM)
    pairwise = predictor.pairwise(z, queries)
    assert pairwise.shape == (4, 6)
    # Chunks of queries (one of them short) give the same logits.
    torch.testing.assert_close(predictor.pairwise(z, queries, chunk=4), pairwise)
    all_queries = torch.arange(6).expand(4, -1)
    straight = predictor(z, queries, all_queries)
    torch.testing.assert_close(pairwise, straight, atol=1e-5, rtol=1e-5)
    # The straightforward computation: the MLP on each pair's [z, u, z * u].
    u = predictor.project_query(queries)
    pairs = torch.cat(
        [z[:, None].expand(-1, 6, -1), u.expand(4, -1, -1), z[:, None] * u], dim=-1
    )
    torch.testing.assert_close(
        pairwise, predictor.mlp(pairs).squeeze(-1), atol=1e-5, rtol=1e-5
    )
    # Each query's logit is its own: masking (dropping) other queries changes nothing.
    torch.testing.assert_close(
        predictor(z, queries, all_queries[:, :2]), straight[:, :2]
    )


def _network_inputs():
    vectors, scores, mask = _set_batch()
    table, codes = _coded(vectors)
    decoder = torch.randint(0, len(table), (BATCH, 5))
    return table, codes, scores, mask, decoder


def test_network_shape_and_masking():
    network = LocusNetwork(QUERY_DIM, embedding_dim=DIM, n_latents=4, n_heads=2).eval()
    table, codes, scores, mask, decoder = _network_inputs()
    logits = network(table, codes, scores, mask, decoder)
    assert logits.shape == (BATCH, 5)
    padded = _scramble_padding(table.view(BATCH, N, -1), mask).reshape(table.shape)
    # Rows of padding evaluations that no target uses do not matter.
    keep = torch.zeros(len(table), dtype=torch.bool)
    keep[codes[mask]] = True
    keep[decoder] = True
    padded = torch.where(keep[:, None], table, padded)
    torch.testing.assert_close(network(padded, codes, scores, mask, decoder), logits)


def test_network_adds_query_noise_only_in_training():
    network = LocusNetwork(
        QUERY_DIM, embedding_dim=DIM, n_latents=4, n_heads=2, dropout=0
    )
    network.query_noise = 0.1
    inputs = _network_inputs()
    network.eval()
    torch.testing.assert_close(network(*inputs), network(*inputs))
    network.train()
    assert not torch.allclose(network(*inputs), network(*inputs))


def test_pad_and_size_buckets():
    values, mask = pad([np.array([1, 2, 3]), np.array([4])], 0, torch.long)
    assert values.tolist() == [[1, 2, 3], [4, 0, 0]]
    assert mask.tolist() == [[True, True, True], [True, False, False]]
    values, mask = pad([np.array([1, 2, 3])], 0, torch.long, width=5)
    assert values.tolist() == [[1, 2, 3, 0, 0]] and mask.sum() == 3
    sizes = np.array([5, 1, 100, 5, 2, 17, 16])
    # Multiples of 16, and from 256 on one of 16 widths per doubling.
    assert padded_width(sizes).tolist() == [16, 16, 112, 16, 16, 32, 16]
    many = np.arange(1, 5000)
    widths = padded_width(many)
    assert (widths % 16 == 0).all() and (widths >= many).all()
    assert (widths[255:] <= many[255:] * 17 / 16).all()
    batches = size_buckets(sizes, max_tokens=40, max_sets=2)
    assert [(b.tolist(), w) for b, w in batches] == [
        ([0, 1], 16),
        ([3, 4], 16),
        ([6], 16),
        ([5], 32),
        ([2], 112),
    ]
    assert sorted(np.concatenate([b for b, _ in batches]).tolist()) == list(range(7))


def test_a_set_embeds_alike_whatever_shares_its_batch():
    # Padding to a width of the set's own and at least 16 rows in the
    # per-set tail keep a set's rows at like places of the batch's tensors;
    # whether a kernel then rounds them alike depends on the processor and the
    # number of threads, so within float32 rounding (tests/vectors.py).
    torch.manual_seed(0)
    encoder = SetEncoder(8, 16, n_latents=4, n_layers=1, n_heads=2).eval()
    table = torch.randn(50, 8)
    projected = encoder.tokenizer.project_queries(table)
    rng = np.random.default_rng(0)
    sets = [rng.choice(50, size, replace=False) for size in (3, 20, 20, 45)]
    scores = [rng.integers(0, 2, len(codes)).astype(np.float32) for codes in sets]

    def embed(members):
        width = int(padded_width([len(sets[i]) for i in members]).max())
        codes, mask = pad([sets[i] for i in members], 0, torch.long, width)
        values, _ = pad([scores[i] for i in members], 0.0, torch.float32, width)
        with torch.inference_mode():
            return encoder.embed_projected(projected, codes, values, mask)

    alone = torch.cat([embed([i]) for i in range(4)])
    assert_same_vectors(embed([1, 2]), alone[1:3])
    assert_same_vectors(embed([2, 1, 2]), alone[[2, 1, 2]])


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

    def queries(inputs, kind):
        """Query code of each encoder or decoder entry, through the batch's table."""
        table = inputs["query_table"].flatten(0, 1)  # sent as (models, k, dim)
        return table[inputs[f"{kind}_codes"]].argmax(-1)

    for _ in range(5):
        inputs, targets = training([(0, 0), (1, 0), (2, 0)])
        # The table holds each query the batch uses, once.
        table = inputs["query_table"].flatten(0, 1)
        assert inputs["query_table"].shape[0] == 3  # one row per model, for skorch
        rows = table[table.any(-1)].argmax(-1)  # zero rows only pad the table
        assert len(set(rows.tolist())) == len(rows)
        used = queries(inputs, "encoder")[inputs["encoder_mask"]]
        assert not set(used.tolist()) & {3, 7, 11}
        decoded = queries(inputs, "decoder")[~torch.isnan(targets)]
        assert not set(decoded.tolist()) & {3, 7, 11}
        # Scores travel with their queries (query j scores j % 2).
        torch.testing.assert_close(
            inputs["encoder_scores"][inputs["encoder_mask"]], (used % 2).float()
        )
    validation = SetCollator(*common, fixed=True, query_mask=query_mask)
    inputs, targets = validation([(0, 0), (1, 1)])
    used = queries(inputs, "encoder")[inputs["encoder_mask"]]
    assert not set(used.tolist()) & {3, 7, 11}
    for row in range(2):
        decoded = queries(inputs, "decoder")[row][~torch.isnan(targets[row])]
        assert sorted(decoded.tolist()) == [3, 7, 11]
    again, _ = validation([(1, 1), (0, 0)])
    torch.testing.assert_close(
        queries(again, "encoder")[1], queries(inputs, "encoder")[0]
    )


# -- test-time refinement -----------------------------------------------------------


def _refinement_inputs():
    predictor = CorrectnessPredictor(QUERY_DIM, DIM, hidden=8).eval()
    with torch.no_grad():
        projected = predictor.project_query(torch.randn(10, QUERY_DIM))
    codes = torch.randint(0, 10, (BATCH, N))
    scores = torch.randint(0, 2, (BATCH, N)).float()
    mask = torch.ones(BATCH, N, dtype=torch.bool)
    mask[1, 4:] = False
    mask[2, 1:] = False
    return predictor, torch.randn(BATCH, DIM), projected, codes, scores, mask


def _objective(predictor, z, start, projected, codes, scores, mask, penalty):
    logits = predictor.score_projected(z, projected, codes)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(
        logits, scores, weight=mask.float(), reduction="none"
    ).sum(1)
    return loss + 0.5 * penalty * (z - start).pow(2).sum(1)


def test_refinement_lowers_each_sets_objective_and_keeps_the_predictor():
    from sklocus.nn.refinement import refine_embeddings

    predictor, start, projected, codes, scores, mask = _refinement_inputs()
    before = [p.clone() for p in predictor.parameters()]
    refined = refine_embeddings(
        predictor,
        start,
        projected,
        codes,
        scores,
        mask,
        steps=30,
        penalty=0.1,
        step_size=0.05,
    )
    with torch.no_grad():
        old = _objective(predictor, start, start, projected, codes, scores, mask, 0.1)
        new = _objective(predictor, refined, start, projected, codes, scores, mask, 0.1)
    assert (new < old).all()
    assert not refined.requires_grad
    for was, now in zip(before, predictor.parameters()):
        assert torch.equal(was, now)


def test_refinement_ignores_padding_and_the_rest_of_the_batch():
    from sklocus.nn.refinement import refine_embeddings

    predictor, start, projected, codes, scores, mask = _refinement_inputs()
    kwargs = dict(steps=20, penalty=0.1, step_size=0.05)
    together = refine_embeddings(
        predictor, start, projected, codes, scores, mask, **kwargs
    )
    noisy_codes = codes.clone()
    noisy_codes[~mask] = torch.randint(0, 10, (int((~mask).sum()),))
    noisy_scores = _scramble_padding(scores.unsqueeze(-1), mask).squeeze(-1)
    scrambled = refine_embeddings(
        predictor, start, projected, noisy_codes, noisy_scores, mask, **kwargs
    )
    torch.testing.assert_close(scrambled, together)
    for i in range(BATCH):
        n = int(mask[i].sum())
        alone = refine_embeddings(
            predictor,
            start[i : i + 1],
            projected,
            codes[i : i + 1, :n],
            scores[i : i + 1, :n],
            None,
            **kwargs,
        )
        torch.testing.assert_close(alone, together[i : i + 1], atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_refinement_moves_less_under_a_larger_penalty():
    from sklocus.nn.refinement import refine_embeddings

    predictor, start, projected, codes, scores, mask = _refinement_inputs()
    moved = [
        (
            refine_embeddings(
                predictor,
                start,
                projected,
                codes,
                scores,
                mask,
                steps=200,
                penalty=penalty,
                step_size=0.05,
            )
            - start
        ).norm(dim=1)
        for penalty in (0.01, 1.0, 100.0)
    ]
    assert (moved[0] > moved[1]).all() and (moved[1] > moved[2]).all()
    assert (moved[2] < 0.05).all()


# Validation losses at the epoch cap, and whether more epochs pay.
FALLING = [0.690, 0.660, 0.630, 0.610, 0.590]
# Last is best, by more than early stopping's threshold (1e-4), yet flat: 0.07%
# an epoch, which asked for more epochs under the old rule.
CREEPING = [0.690, 0.600, 0.5900, 0.5895, 0.5890, 0.5887]
TURNED = [0.690, 0.600, 0.580, 0.590]


@pytest.mark.parametrize(
    "losses, pays",
    [(FALLING, True), (CREEPING, False), (TURNED, False), ([0.69], False)],
)
def test_more_epochs_pay_only_while_the_validation_loss_falls_clearly(losses, pays):
    from sklocus.nn.training import FALLING_TOLERANCE, recent_fall, still_falling

    assert still_falling(losses) is pays
    if pays:
        assert recent_fall(losses) > FALLING_TOLERANCE
    # The mean fall over the last three epochs, relative to the last loss.
    assert recent_fall(FALLING) == pytest.approx((0.660 - 0.590) / 3 / 0.590)
    assert recent_fall([0.69]) is None
