"""The fixed cost of a query: RSS after ``import extagg`` and after the kernels a query needs.

Each measurement runs in a fresh process (warm numba cache: a first, discarded run fills it) and
prints the RSS after the imports and after a tiny query of each kind, and which compiled kernels
the query loaded (numba compiles or loads a kernel on its first call, per argument types, so a
query loads only what its types need)::

    .venv/bin/python benchmarks/fixed_cost.py
"""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = r"""
import json, sys
def rss():
    return int([l.split()[1] for l in open("/proc/self/status") if l.startswith("VmRSS")][0]) // 1024
out = {"python": rss()}
import numpy as np, pyarrow as pa
out["numpy+pyarrow"] = rss()
import extagg
out["import extagg"] = rss()
from numba.core.registry import CPUDispatcher
query = sys.argv[1]
if query == "int-sum":
    batch = {"k": np.arange(1000) % 7, "v": np.arange(1000)}
    aggs = {"s": ("v", "sum")}
elif query == "decimal-sum":
    batch = pa.table({"k": np.arange(1000) % 7,
                      "v": pa.array(np.arange(1000), pa.int32()).cast(pa.decimal128(15, 2))})
    aggs = {"s": ("v", "sum"), "m": ("v", "mean")}
else:
    batch = {"k": np.array([str(i % 7) for i in range(1000)], dtype=object), "v": np.arange(1000)}
    aggs = {"s": ("v", "sum"), "n": ("*", "count")}
extagg.aggregate(batch, keys="k", aggs=aggs)
out["after query"] = rss()
loaded = []
for name, mod in list(sys.modules.items()):
    if name.startswith("extagg"):
        for attr, obj in vars(mod).items():
            if isinstance(obj, CPUDispatcher) and obj.__module__ == name and obj.signatures:
                loaded.append(f"{name.rsplit('.', 1)[-1]}.{attr}")
out["kernels"] = sorted(loaded)
print(json.dumps(out))
"""


def main() -> None:
    for query in ("int-sum", "decimal-sum", "string-key"):
        subprocess.run([sys.executable, "-c", PROBE, query], check=True, capture_output=True)
        res = json.loads(
            subprocess.run(
                [sys.executable, "-c", PROBE, query], check=True, capture_output=True, text=True
            ).stdout
        )
        kernels = res.pop("kernels")
        figures = ", ".join(f"{k} {v} MB" for k, v in res.items())
        print(f"{query}: {figures}; {len(kernels)} kernels loaded: {' '.join(kernels)}")


if __name__ == "__main__":
    main()
