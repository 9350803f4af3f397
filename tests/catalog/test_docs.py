"""docs/warehouse.md documents every warehouse column, and nothing that is not one."""

import re
from pathlib import Path

from dyna_resources.catalog.warehouse import warehouse_columns

DOC = Path(__file__).resolve().parents[2] / "docs" / "warehouse.md"


def test_every_warehouse_column_is_documented_with_its_type():
    section = DOC.read_text().split("## The warehouse `episodes` table", 1)[1].split("\n## ", 1)[0]
    documented = dict(re.findall(r"^\| `(\w+)` \| (\w+) \|", section, flags=re.M))
    assert documented == dict(warehouse_columns())
