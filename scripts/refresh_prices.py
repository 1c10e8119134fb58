"""Rewrite one cloud's price table, ``skyward/providers/<cloud>/prices.json``: its
``on_demand`` prices and its ``as_of`` date (the rest of the file, its ``source`` note, is kept).

AWS: asks the AWS Price List Query API (``pricing:GetProducts``, any AWS credentials with
that permission; the API answers in us-east-1) for the on-demand Linux, shared-tenancy price
of every AWS machine type in ``skyward.providers.cloud.catalog``, in every region.

GCP: reads a ``pricing.yml`` made from Google's Cloud Billing Catalog API (the one the
open-source google-cloud-pricing-cost-calculator project publishes, or one made with its
tools: ``compute.instance.<type>.cost.<region>.hour``) for every GCP machine type of the
catalog with built-in GPUs or none (N1 machines are priced by their attached GPUs, in their
rows of ``gcp/machines.json``).

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
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
REGION = re.compile(r"^[a-z]{2}(-gov|-iso[a-z]*)?-[a-z]+-\d$")


def table_path(cloud: str) -> Path:
    return ROOT / "skyward" / "providers" / cloud / "prices.json"


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


def render(current: dict[str, Any], table: dict[str, dict[str, float]], as_of: str) -> str:
    """The file with ``table`` and ``as_of`` in it, as it is committed: types and regions
    sorted, one region per line, so a refresh's diff is the prices that moved."""
    ordered = {name: dict(sorted(table[name].items())) for name in sorted(table)}
    return json.dumps({**current, "as_of": as_of, "on_demand": ordered}, indent=2) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say whether it changed")
    parser.add_argument("--profile", default=None, help="the AWS profile to use")
    parser.add_argument("--cloud", choices=("aws", "gcp"), default="aws")
    parser.add_argument("--from", dest="source", type=Path, help="GCP: the pricing.yml")
    options = parser.parse_args()

    sys.path.insert(0, str(ROOT))
    from skyward.providers.cloud import catalog

    path = table_path(options.cloud)
    current = json.loads(path.read_text())
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
    text = render(current, table, datetime.date.today().isoformat())
    if options.check:
        same = json.loads(text)["on_demand"] == current["on_demand"]
        print("up to date" if same else "out of date")
        return 0 if same else 1
    path.write_text(text)
    print(f"wrote {path} ({len(table)} types)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
