"""Attention blocks of the LOCUS set encoder.

Masks are boolean key-padding masks of shape ``(batch, n_keys)``: ``True`` marks a
real element, ``False`` padding. Padding never takes part in any attention.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

# MKL's float32 matrix product sums a row's terms in an order that depends on how
# many rows the matrix has when it has fewer than 12 (1 to 8 threads measured);
# from 12 rows on, each row comes out the same whatever the others hold. The tail
# of the set encoder has one row per set of a batch, so it runs on at least
# _MIN_ROWS rows: a set's embedding then does not depend on its batch-mates, bit
# for bit with the kernels measured and within float32 rounding with any
# (docs/user_guide/streaming.rst, "Why the vectors agree").
_MIN_ROWS = 16


def apart_from_batch(function, *rows):
    """Apply a row-wise ``function`` so that no row's result depends on the others.

    Pads every tensor of ``rows`` (all of one length along the first axis) with
    zero rows up to ``_MIN_ROWS`` before the call and drops the padding after.

    Parameters
    ----------
    function : callable
        Maps tensors of shape ``(n, ...)`` to one tensor of shape ``(n, ...)``,
        each output row computed from the same input rows alone.
    *rows : Tensor of shape (n, ...)

    Returns
    -------
    Tensor of shape (n, ...)
    """
    n_rows = len(rows[0])
    if n_rows >= _MIN_ROWS:
        return function(*rows)
    padded = [
        torch.cat([r, r.new_zeros(_MIN_ROWS - n_rows, *r.shape[1:])]) for r in rows
    ]
    return function(*padded)[:n_rows]


class MultiHeadAttention(nn.Module):
    """Multi-head attention of queries over keys and values.

    Parameters
    ----------
    dim : int
        Width of queries, keys, values and output.
    n_heads : int
        Number of heads; must divide ``dim``.
    dropout : float, default=0.0
        Dropout on the attention weights during training.
    """

    def __init__(self, dim: int, n_heads: int, dropout: float = 0.0):
        super().__init__()
        if dim % n_heads:
            raise ValueError(f"n_heads={n_heads} must divide the width {dim}")
        self.n_heads = n_heads
        self.dropout = dropout
        self.to_query = nn.Linear(dim, dim)
        self.to_key_value = nn.Linear(dim, 2 * dim)
        self.to_output = nn.Linear(dim, dim)

    def forward(self, queries, keys, key_mask=None):
        """Attend.

        Parameters
        ----------
        queries : Tensor of shape (batch, n_queries, dim)
        keys : Tensor of shape (batch, n_keys, dim)
            Keys and values (the same inputs, projected twice).
        key_mask : BoolTensor of shape (batch, n_keys), optional
            ``True`` for real keys. ``None`` means every key is real.

        Returns
        -------
        Tensor of shape (batch, n_queries, dim)
        """
        batch, n_queries, dim = queries.shape
        head_dim = dim // self.n_heads
        q = self.to_query(queries).view(batch, n_queries, self.n_heads, head_dim)
        k, v = self.to_key_value(keys).chunk(2, dim=-1)
        k = k.reshape(batch, -1, self.n_heads, head_dim)
        v = v.reshape(batch, -1, self.n_heads, head_dim)
        mask = None if key_mask is None else key_mask[:, None, None, :]
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            attn_mask=mask,
            dropout_p=self.dropout if self.training else 0.0,
        )
        return self.to_output(out.transpose(1, 2).reshape(batch, n_queries, dim))

    def one_query(self, query, keys, key_mask=None):
        """Attend with one query shared by every set: ``forward`` for pooling.

        Equal to ``forward(query.expand(batch, 1, dim), keys, key_mask)[:, 0]`` but
        the keys and values are never projected: a head's score of key ``x`` is
        ``q_h . (W_k x + b_k)_h``, i.e. ``x`` dotted with ``W_k,h^T q_h`` (the bias
        term is the same for every key, and softmax ignores it), and the attended
        value is ``W_v,h (sum_i a_i x_i) + b_v,h sum_i a_i``. That costs ``2 *
        n_heads * dim`` multiply-adds per key instead of the ``2 * dim * dim`` of
        projecting it.

        Parameters
        ----------
        query : Tensor of shape (dim,)
        keys : Tensor of shape (batch, n_keys, dim)
        key_mask : BoolTensor of shape (batch, n_keys), optional
            ``True`` for real keys.

        Returns
        -------
        Tensor of shape (batch, dim)
        """
        batch, _, dim = keys.shape
        heads, head_dim = self.n_heads, dim // self.n_heads
        q = self.to_query(query).view(heads, head_dim) * head_dim**-0.5
        weight_key, weight_value = self.to_key_value.weight.view(
            2, heads, head_dim, dim
        )
        bias_value = self.to_key_value.bias[dim:].view(heads, head_dim)
        reading = torch.einsum("hd,hde->eh", q, weight_key)  # (dim, heads)
        scores = keys @ reading  # (batch, n_keys, heads)
        if key_mask is not None:
            scores = scores.masked_fill(~key_mask[..., None], float("-inf"))
        weights = scores.softmax(dim=1)
        if self.training and self.dropout > 0:
            weights = F.dropout(weights, self.dropout)
        mixed = weights.transpose(1, 2) @ keys  # (batch, heads, dim)

        def read_out(mixed, total_weight):
            values = torch.einsum("bhe,hde->bhd", mixed, weight_value)
            values = values + bias_value * total_weight[..., None]
            return self.to_output(values.reshape(len(mixed), dim))

        return apart_from_batch(read_out, mixed, weights.sum(dim=1))


class AttentionBlock(nn.Module):
    """``Block(Q, K, V)``: attention with a residual, layer norm and feed-forward.

    Pre-norm form, ``H = Q + attention(norm(Q), norm(K))`` then
    ``H + feed_forward(norm(H))``: the residual stream passes through unnormalised,
    which lets the model-specific signal of a set reach the output from the first
    steps of training (a post-norm stack of these blocks was seen to collapse every
    set to nearly the same embedding).

    Parameters
    ----------
    dim : int
        Width of the inputs and output.
    n_heads : int
        Attention heads.
    dropout : float, default=0.0
        Dropout on attention weights and after each sub-layer, during training.
    """

    def __init__(self, dim: int, n_heads: int, dropout: float = 0.0):
        super().__init__()
        self.norm_queries = nn.LayerNorm(dim)
        self.norm_keys = nn.LayerNorm(dim)
        self.attention = MultiHeadAttention(dim, n_heads, dropout)
        self.norm_feed_forward = nn.LayerNorm(dim)
        self.feed_forward = nn.Sequential(
            nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim)
        )
        self.dropout = nn.Dropout(dropout)

    def forward(self, queries, keys, key_mask=None):
        """Apply the block.

        Parameters
        ----------
        queries : Tensor of shape (batch, n_queries, dim)
        keys : Tensor of shape (batch, n_keys, dim)
        key_mask : BoolTensor of shape (batch, n_keys), optional
            ``True`` for real keys.

        Returns
        -------
        Tensor of shape (batch, n_queries, dim)
        """
        attended = self.attention(
            self.norm_queries(queries), self.norm_keys(keys), key_mask
        )
        return self._residual_and_feed_forward(queries, attended)

    def one_query(self, query, keys, key_mask=None):
        """Apply the block with one query shared by every set.

        Equal to ``forward(query.expand(batch, 1, dim), keys, key_mask)[:, 0]``,
        through :meth:`MultiHeadAttention.one_query`.

        Parameters
        ----------
        query : Tensor of shape (dim,)
        keys : Tensor of shape (batch, n_keys, dim)
        key_mask : BoolTensor of shape (batch, n_keys), optional

        Returns
        -------
        Tensor of shape (batch, dim)
        """
        attended = self.attention.one_query(
            self.norm_queries(query), self.norm_keys(keys), key_mask
        )
        return apart_from_batch(
            lambda rows: self._residual_and_feed_forward(query.expand_as(rows), rows),
            attended,
        )

    def _residual_and_feed_forward(self, queries, attended):
        hidden = queries + self.dropout(attended)
        return hidden + self.dropout(self.feed_forward(self.norm_feed_forward(hidden)))


class LatentBottleneckLayer(nn.Module):
    """Learned latents attend to the tokens, then the tokens attend back.

    ``H = Block(U, X, X)`` then ``X = Block(X, H, H)``: cost ``O(n_tokens *
    n_latents)``, linear in the size of the set.

    Parameters
    ----------
    dim : int
        Width of tokens and latents.
    n_latents : int
        Number of learned latents ``U``.
    n_heads : int
        Attention heads.
    dropout : float, default=0.0
        Dropout inside the blocks, during training.
    """

    def __init__(self, dim: int, n_latents: int, n_heads: int, dropout: float = 0.0):
        super().__init__()
        self.latents = nn.Parameter(torch.randn(n_latents, dim) * dim**-0.5)
        self.latents_from_tokens = AttentionBlock(dim, n_heads, dropout)
        self.tokens_from_latents = AttentionBlock(dim, n_heads, dropout)

    def forward(self, tokens, mask=None):
        """Update the tokens through the latents.

        Parameters
        ----------
        tokens : Tensor of shape (batch, n_tokens, dim)
        mask : BoolTensor of shape (batch, n_tokens), optional
            ``True`` for real tokens.

        Returns
        -------
        Tensor of shape (batch, n_tokens, dim)
            Padded rows hold finite values that no later step reads.
        """
        latents = self.latents.expand(tokens.shape[0], -1, -1)
        latents = self.latents_from_tokens(latents, tokens, mask)
        return self.tokens_from_latents(tokens, latents)


class AttentionPooling(nn.Module):
    """One learned query attends over the tokens, giving one vector per set.

    Parameters
    ----------
    dim : int
        Width of the tokens.
    n_heads : int
        Attention heads.
    dropout : float, default=0.0
        Dropout inside the block, during training.
    """

    def __init__(self, dim: int, n_heads: int, dropout: float = 0.0):
        super().__init__()
        self.seed = nn.Parameter(torch.randn(1, dim) * dim**-0.5)
        self.block = AttentionBlock(dim, n_heads, dropout)

    def forward(self, tokens, mask=None):
        """Pool.

        Parameters
        ----------
        tokens : Tensor of shape (batch, n_tokens, dim)
        mask : BoolTensor of shape (batch, n_tokens), optional
            ``True`` for real tokens.

        Returns
        -------
        Tensor of shape (batch, dim)
        """
        return self.block.one_query(self.seed[0], tokens, mask)
