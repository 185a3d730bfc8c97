"""The engine's input errors (all `ValueError`s, so callers may catch either)."""
from __future__ import annotations


class EngineError(ValueError):
  """Base class of the engine's input errors."""


class SiteNotFoundError(EngineError):
  """The named site was never called during the run."""


class SpanUnsupportedError(EngineError):
  """A span patch was requested at a port that cannot decompose h by tokens."""


class MaskShapeError(EngineError):
  """A probe mask does not fit the site's activation."""


class LiftedSiteError(EngineError):
  """The site lies inside a lifted transform (nn.remat, nn.scan, ...) whose
  inner trace a recorded value cannot leave."""


class PortCheckError(EngineError):
  """`check_port` found a declared decomposition that does not hold; the
  `PortCheck` report is the ``report`` attribute."""

  def __init__(self, message: str, report=None):
    super().__init__(message)
    self.report = report
