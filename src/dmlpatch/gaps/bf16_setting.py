"""The bfloat16 setting (``--bf16`` / ``$DMLPATCH_BF16``): what bfloat16 runs as on DirectML.

It lives apart from the dtype policy (``dmlpatch.opfix.dtype_policy``) so that the runner can
check the option before the program starts without loading the op fixes (milliseconds of
imports that an empty script would pay).
"""

from __future__ import annotations

from dmlpatch.environment_variables import DMLPATCH_BF16
from dmlpatch.errors import UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional

#: What bfloat16 can run as, the default first.
BF16_CHOICES = ("float32", "float16")


def parse_bf16(text: Optional[str], given_as: str = DMLPATCH_BF16 + "=") -> str:
    """``DMLPATCH_BF16``'s (or ``--bf16``'s) value, float32 when unset; a one-line error
    otherwise. Needs no torch: the runner checks ``--bf16`` before the program starts."""
    if not text:
        return BF16_CHOICES[0]
    if text not in BF16_CHOICES:
        raise UsageError(
            f"{given_as}{text!r}: bfloat16 runs on DirectML as float32 or float16; "
            f"choose one of {', '.join(BF16_CHOICES)}"
        )
    return text
