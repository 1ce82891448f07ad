"""Test helper (not collected): write a DataFrame as the file kind its path names."""

import numpy as np


def write_table(df, path):
    """``df`` to ``path`` as CSV (``.csv``, no index), a 2-D ``.npy`` of its values, or Parquet
    (anything else); returns the path as a string, for the CLIs' tabular-input tests."""
    if str(path).endswith(".csv"):
        df.to_csv(path, index=False)
    elif str(path).endswith(".npy"):
        np.save(path, df.to_numpy())
    else:
        df.to_parquet(path)
    return str(path)
