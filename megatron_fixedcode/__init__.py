"""megatron-fixedcode: decoder-only pretraining on megatron-core with a fixed binary token code as input."""

from megatron_fixedcode.compat.nvrx_release import settle_nvrx_release

settle_nvrx_release()  # before any megatron-core import (compat/nvrx_release.py says why)
