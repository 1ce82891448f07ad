"""Write a synthetic `ages.csv` (one record per person) beside this script for `ages.toml`."""

from pathlib import Path

import numpy as np

rng = np.random.default_rng(7)
ages = np.clip(rng.normal(40, 18, size=20000), 0, 99).astype(int)
path = Path(__file__).with_name("ages.csv")
path.write_text("id,age\n" + "".join(f"{i},{a}\n" for i, a in enumerate(ages)))
print(f"wrote {path} ({ages.size} records)")
