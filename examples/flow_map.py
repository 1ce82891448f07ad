"""Release DP traffic flows for a small synthetic city and plot the consistent flow map.

    python examples/flow_map.py [OUT.png]

Needs the ``plot`` extra (matplotlib).  Each street segment is drawn with a width proportional to
its released flow; the left panel shows the true flows, the right panel the DP release after flow
conservation.  The release cuts every trip to its first 20 edges (the bound its noise is calibrated
for) and draws exact discrete Laplace noise from OS entropy through the package's one measurement
path (``secure=False`` would draw float noise, an opt-out for experiments).  Showing the true flows and the RMSE is an evaluation on
synthetic data (``keep_truth=True``): a real release publishes only the right panel.  The release
ends in the common model (``to_release()``: every consistent flow labelled by ``part`` and ``id``,
its exact variance and 95% interval, the ledger), saved to a release file in a temporary directory
and read back with ``sparsedp.load_release`` (marked ``private=False``: this run was evaluated).
"""

import sys
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.collections import LineCollection  # noqa: E402

import sparsedp  # noqa: E402
from sparsedp.flows import random_trips, release_flows, road_grid  # noqa: E402

out = sys.argv[1] if len(sys.argv) > 1 else "flow_map.png"
road = road_grid(15, 15, seed=0)
trips = random_trips(road, 3000, seed=1, max_edges=20, origins=60)
release = release_flows(road, trips, epsilon=1.0, max_edges=20, keep_truth=True)
noisy_rmse, consistent_rmse = release.rmse()
print(f"{road.nodes} intersections, {road.edges} segments, {trips.count} trips cut to <= {release.max_edges} edges; "
      f"{'exact discrete' if release.secure else 'float'} Laplace scale {release.scale:g}")
print(f"evaluation (not private): RMSE noisy {noisy_rmse:.2f} -> consistent {consistent_rmse:.2f}; residual {release.solve.residual:.1e} ({release.solve.solver})")

rel = release.to_release(private=False)  # the common release model; evaluated above, so not a publication
lower, upper = rel.confidence_intervals(0.95)
edge = rel.labels["part"] == "edge"
print(f"release: {len(rel)} values ({edge.sum()} edge flows), variances {rel.variance_method}; "
      f"median 95% interval half-width of an edge flow {np.median((upper - lower)[edge]) / 2:.1f}")
with tempfile.TemporaryDirectory() as tmp:
    back = sparsedp.load_release(rel.save(Path(tmp) / "flows.npz"))  # never the trips
    print(f"flows.npz: {len(back)} values, ledger total epsilon {back.epsilon:g}, private={back.private}")

fig, axes = plt.subplots(1, 2, figsize=(12, 6))
segments = np.stack([road.coords[road.tails], road.coords[road.heads]], axis=1)
# offset the two directions of a two-way street so both are visible
normal = segments[:, 1] - segments[:, 0]
normal = np.stack([-normal[:, 1], normal[:, 0]], axis=1) / np.linalg.norm(normal, axis=1, keepdims=True)
segments = segments + 0.08 * normal[:, None, :]
for ax, flows, title in ((axes[0], release.truth[: road.edges], "true flows"),
                         (axes[1], release.consistent[: road.edges],
                          f"DP release, eps = {release.epsilon:g}, consistent")):
    widths = 0.2 + 4.0 * np.clip(flows, 0, None) / max(1.0, np.percentile(release.truth[: road.edges], 99))
    ax.add_collection(LineCollection(segments, linewidths=widths, colors="tab:blue", alpha=0.8))
    ax.scatter(*road.coords.T, s=3, color="k")
    ax.set_title(title)
    ax.set_aspect("equal")
    ax.autoscale()
    ax.axis("off")
fig.tight_layout(rect=(0, 0, 1, 0.95))
fig.savefig(out, dpi=120)
print(f"wrote {out}")
