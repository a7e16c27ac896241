"""The study kinds, by the name a spec's ``kind`` gives (attnlab.studies.spec.KINDS)."""

from __future__ import annotations

from attnlab.studies.kinds.base import StudyKind
from attnlab.studies.kinds.lm import LanguageModel
from attnlab.studies.kinds.overhead import Overhead
from attnlab.studies.kinds.retrieval import Retrieval

KINDS: dict[str, StudyKind] = {
    "lm": LanguageModel(),
    "overhead": Overhead(),
    "retrieval": Retrieval(),
}
