"""Rewrite ``skyward/providers/cloud/prices.py`` from AWS's public price list.

Asks the AWS Price List Query API (``pricing:GetProducts``, any AWS credentials with that
permission; the API answers in us-east-1) for the on-demand Linux, shared-tenancy price of
every AWS machine type in ``skyward.providers.cloud.catalog``, in every region, and writes the
dated table. It needs the network and credentials, so it cannot run in the offline test
environment: run it by hand, look at the diff, commit it.

    python scripts/refresh_prices.py            # rewrites skyward/providers/cloud/prices.py
    python scripts/refresh_prices.py --check    # exits 1 if the table is out of date
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
REGION = re.compile(r"^[a-z]{2}(-gov|-iso[a-z]*)?-[a-z]+-\d$")
TABLE = ROOT / "skyward" / "providers" / "cloud" / "prices.py"


def on_demand_prices(instance_type: str, client: Any) -> dict[str, float]:
    """region -> USD per hour for ``instance_type``, from the price list."""
    filters = [
        {"Type": "TERM_MATCH", "Field": field, "Value": value}
        for field, value in (
            ("instanceType", instance_type),
            ("operatingSystem", "Linux"),
            ("tenancy", "Shared"),
            ("preInstalledSw", "NA"),
            ("capacitystatus", "Used"),
            ("licenseModel", "No License required"),
        )
    ]
    prices: dict[str, float] = {}
    for page in client.get_paginator("get_products").paginate(
        ServiceCode="AmazonEC2", Filters=filters
    ):
        for text in page["PriceList"]:
            product = json.loads(text)
            region = product["product"]["attributes"].get("regionCode", "")
            if not REGION.match(region):
                continue  # Wavelength and Local Zones are not regions a pool runs in
            for term in product.get("terms", {}).get("OnDemand", {}).values():
                for dimension in term["priceDimensions"].values():
                    usd = float(dimension["pricePerUnit"].get("USD", "0") or 0)
                    if dimension.get("unit") == "Hrs" and usd > 0:
                        prices[region] = usd
    return prices


def render(table: dict[str, dict[str, float]], as_of: str) -> str:
    current = TABLE.read_text()
    head = current[: current.index("AS_OF = ")]
    lines = [head + f'AS_OF = "{as_of}"', "", "# cloud -> machine type -> region -> USD per hour"]
    lines.append("ON_DEMAND: dict[str, dict[str, dict[str, float]]] = {")
    lines.append('    "aws": {')
    for name in sorted(table):
        body = ", ".join(f'"{r}": {table[name][r]!r}' for r in sorted(table[name]))
        lines.append(f'        "{name}": {{{body}}},')
    lines += ["    },", "}", ""]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say whether it changed")
    parser.add_argument("--profile", default=None, help="the AWS profile to use")
    options = parser.parse_args()

    import boto3

    sys.path.insert(0, str(ROOT))
    from skyward.providers.cloud import catalog

    session = boto3.session.Session(profile_name=options.profile)
    client = session.client("pricing", region_name="us-east-1")
    table = {m.type: on_demand_prices(m.type, client) for m in catalog.machines("aws")}
    missing = [name for name, prices in table.items() if not prices]
    if missing:
        print(f"no price found for {', '.join(missing)}", file=sys.stderr)
    text = render(table, datetime.date.today().isoformat())
    if options.check:
        import tempfile

        with tempfile.TemporaryDirectory() as scratch:
            fresh = Path(scratch) / "prices.py"
            fresh.write_text(text)
            subprocess.run([sys.executable, "-m", "ruff", "format", str(fresh)], check=False)
            text = fresh.read_text()
        old = TABLE.read_text()
        same = old[old.index("ON_DEMAND") :] == text[text.index("ON_DEMAND") :]
        print("up to date" if same else "out of date")
        return 0 if same else 1
    TABLE.write_text(text)
    # The committed table is ruff-formatted; format it the same way so the diff is the prices.
    subprocess.run([sys.executable, "-m", "ruff", "format", str(TABLE)], check=False)
    print(f"wrote {TABLE} ({len(table)} types)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
