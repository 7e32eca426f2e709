"""The operator's web dashboard, served by the worker (`prime-node start --dashboard`) and the validator
(`prime-validate run --dashboard-port P`): one self-contained page that polls `GET /api/state` (docs/dashboard.md).

- `model`: pure functions from the journal and a chain reading to the worker's snapshot;
- `chain`: the worker's chain reads, cached and made in a thread on a refresh interval;
- `worker`: the worker's `DashboardSource`; the validator's lives in `validator/dashboard.py`;
- `server`, `page`: the aiohttp app and the HTML it serves.
"""

from node.dashboard.server import DashboardSource, serve_dashboard

__all__ = ["DashboardSource", "serve_dashboard"]
