"""Each provider's class under its public name, for type checkers only.

At run time ``skyward`` finds its providers in ``providers/registry.py``; a type checker
cannot read that table, so ``skyward/__init__`` star-imports this module inside
``if TYPE_CHECKING:`` and nothing imports it at run time (it would load every provider).
One line per registry entry: ``tests/providers/test_registry.py`` checks that the two agree.
"""

from skyward.providers.aws import AWS as AWS
from skyward.providers.azure import Azure as Azure
from skyward.providers.gcp import GCP as GCP
from skyward.providers.local import Local as Local
from skyward.providers.runpod import RunPod as RunPod
from skyward.providers.slurm import Slurm as Slurm
from skyward.providers.ssh import SSH as SSH
from skyward.providers.vastai import VastAI as VastAI
