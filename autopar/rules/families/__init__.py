"""Op families; importing this package registers every rule in the default rule set.

One module per family (see ``docs/op-rules.md`` for the table of op types):

=============  ===============================================================
elementwise    unary ops, broadcasting binary ops, their gradients
matmul         matmul, batch_matmul, broadcast_matmul(_grad_b), fused_matmul_bias
reduce         reduce_*, reduce_sum_like, broadcast_like, square_sum, two-stage max/min
views          reshape-like views, transpose, expand, slice, concat
nn             softmax (plain and fused), dropout, bias_add, layer_norm, rms_norm
embedding      gather / embedding, unsorted_segment_sum(_like), one_hot
loss           sparse softmax cross entropy (and _ms), nll
conv           conv1d/2d/3d, conv_data_grad, conv_filter_grad, conv_bias_grad (batch split)
optimizer      adam_update, sgd_update ... (full N-D rules, ZeRO-aware)
system         variable, input, output, ticks, schedules, constants, fills, layout casts
=============  ===============================================================
"""

from autopar.rules.families import (  # imported to register their rules
    conv,
    elementwise,
    embedding,
    loss,
    matmul,
    nn,
    optimizer,
    reduce,
    system,
    views,
)

__all__ = [
    "conv",
    "elementwise",
    "embedding",
    "loss",
    "matmul",
    "nn",
    "optimizer",
    "reduce",
    "system",
    "views",
]
