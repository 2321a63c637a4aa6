"""The docs promise what the code does: the compatibility matrix matches ApiVersions."""

from __future__ import annotations

import re
from pathlib import Path

from kafka_gateway.apis import APIS

DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_compatibility_matrix_lists_every_supported_api():
    table = (DOCS / "compatibility.md").read_text()
    documented = {
        int(key): versions
        for key, versions in re.findall(r"^\| (\d+) \| [A-Za-z]+ \| (\d+(?:-\d+)?) \|", table, re.M)
    }
    advertised = {
        api.key: f"{api.min_version}-{api.max_version}" if api.min_version != api.max_version
        else str(api.min_version)
        for api in APIS.values()
    }
    assert documented == advertised
