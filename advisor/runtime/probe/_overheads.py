"""``python -m advisor.runtime.probe._overheads``: a fresh process measures its CUDA overheads, prints JSON.

Run in a child by ``advisor calibrate`` so that nothing else has touched CUDA in the process
(advisor.runtime.probe._memory.measure_overheads says what is measured and how).
"""

from __future__ import annotations

import json
import sys


def main() -> int:
    from advisor.runtime.probe._memory import measure_overheads
    from advisor.runtime.probe._worker import versions

    try:
        print(json.dumps({**measure_overheads(), "versions": versions()}))
    except Exception as e:  # noqa: BLE001 - one line for the parent
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
