"""Rewrite one cloud's part of ``skyward/providers/cloud/prices.py``; the other's is kept.

AWS: asks the AWS Price List Query API (``pricing:GetProducts``, any AWS credentials with
that permission; the API answers in us-east-1) for the on-demand Linux, shared-tenancy price
of every AWS machine type in ``skyward.providers.cloud.catalog``, in every region.

GCP: reads a ``pricing.yml`` made from Google's Cloud Billing Catalog API (the one the
open-source google-cloud-pricing-cost-calculator project publishes, or one made with its
tools: ``compute.instance.<type>.cost.<region>.hour``) for every GCP machine type of the
catalog with built-in GPUs or none (N1 machines are priced by their attached GPUs, in the
catalog itself).

Both need the network (and AWS credentials), so they cannot run in the offline test
environment: run by hand, look at the diff, commit it.

    python scripts/refresh_prices.py                           # the AWS table
    python scripts/refresh_prices.py --cloud gcp --from pricing.yml
    python scripts/refresh_prices.py --check                   # exits 1 if out of date
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


def gcp_prices(path: Path, types: list[str]) -> dict[str, dict[str, float]]:
    """machine type -> region -> USD per hour, from a ``pricing.yml``."""
    import yaml

    instances = yaml.safe_load(path.read_text())["compute"]["instance"]
    table: dict[str, dict[str, float]] = {}
    for name in types:
        cost = instances.get(name, {}).get("cost", {})
        hourly = {r: round(float(c["hour"]), 6) for r, c in cost.items() if c.get("hour")}
        if hourly:
            table[name] = hourly
    return table


def render(tables: dict[str, dict[str, dict[str, float]]], as_of: dict[str, str]) -> str:
    current = TABLE.read_text()
    head = current[: current.index("\nAS_OF = ") + 1]
    lines = [head + f"AS_OF = {as_of!r}", "", "# cloud -> machine type -> region -> USD per hour"]
    lines.append("ON_DEMAND: dict[str, dict[str, dict[str, float]]] = {")
    for cloud, table in tables.items():
        lines.append(f'    "{cloud}": {{')
        for name in sorted(table):
            body = ", ".join(f'"{r}": {table[name][r]!r}' for r in sorted(table[name]))
            lines.append(f'        "{name}": {{{body}}},')
        lines.append("    },")
    lines += ["}", ""]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say whether it changed")
    parser.add_argument("--profile", default=None, help="the AWS profile to use")
    parser.add_argument("--cloud", choices=("aws", "gcp"), default="aws")
    parser.add_argument("--from", dest="source", type=Path, help="GCP: the pricing.yml")
    options = parser.parse_args()

    sys.path.insert(0, str(ROOT))
    from skyward.providers.cloud import catalog, prices

    tables, as_of = dict(prices.ON_DEMAND), dict(prices.AS_OF)
    if options.cloud == "gcp":
        if options.source is None:
            parser.error("--cloud gcp needs --from pricing.yml")
        types = sorted({m.type for m in catalog.machines("gcp") if m.attach is None})
        table = gcp_prices(options.source, types)
        missing = [name for name in types if name not in table]
    else:
        import boto3

        session = boto3.session.Session(profile_name=options.profile)
        client = session.client("pricing", region_name="us-east-1")
        table = {m.type: on_demand_prices(m.type, client) for m in catalog.machines("aws")}
        missing = [name for name, found in table.items() if not found]
    if missing:
        print(f"no price found for {', '.join(missing)}", file=sys.stderr)
    tables[options.cloud] = table
    as_of[options.cloud] = datetime.date.today().isoformat()
    text = render(tables, as_of)
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
