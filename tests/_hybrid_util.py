"""The hybrid strategy built entry by entry, for tests of sparsedp.optimize.hybrid (not collected)."""

import numpy as np
import scipy.sparse as sp

from sparsedp.optimize.hybrid import _local_layout, _row_weights, block_starts


def normalised_matrix(n, b, radices, R, theta, delta, p):
    """The normalised strategy ``[block trees; Theta B] / delta`` entry by entry (no Woodbury, no
    block algebra): the explicit matrix the fast objective and solver are checked against."""
    starts = block_starts(n, b)
    blocks = []
    for j in range(starts.size - 1):
        lay = _local_layout(int(starts[j + 1] - starts[j]), radices)
        blocks.append(sp.diags(_row_weights(lay, R, p) / delta[j]) @ lay.matrix())
    return np.vstack([sp.block_diag(blocks).toarray(), np.repeat(theta / delta[None, :], np.diff(starts), axis=1)])
