"""Exceptions raised by glyd. Every one names the file, tensor or field at fault."""


class GlydError(Exception):
    """Base class of glyd's errors."""


class FormatError(GlydError, ValueError):
    """A file or packed array set is not in a format glyd can read (bad magic, version, shape)."""


class CorruptError(GlydError):
    """Data is damaged: truncated, a checksum or sha256 that does not match."""


class DestinationExistsError(GlydError, FileExistsError):
    """An output path already exists; glyd never overwrites."""


class MissingDependencyError(GlydError, ImportError):
    """An optional package that a command or function needs is not installed; the message names it
    and the extra of glyd that installs it."""


class UnsupportedError(GlydError, ValueError):
    """A request glyd cannot honour (for a packed model: an option, a placement, a dtype; a
    destination inside the folder being read); it is refused before anything is loaded, written or
    changed, never dropped silently."""
