"""`input_file` content parts for upstreams that take only text and images (pure).

A text file (a `text/*` type, or JSON, XML, YAML, TOML, JavaScript, a shell script) sent inline as
`file_data` — a base64 `data:` URL, or bare base64 with the type guessed from `filename` — is decoded
and given to the model as text, headed by its name. Anything else (PDFs, images as files, `file_id`,
`file_url`) has no faithful spelling for a chat or completions server and is refused, naming the part.
"""

from __future__ import annotations

import base64
import binascii
import mimetypes
from typing import Any

TEXT_TYPES = frozenset({"application/json", "application/xml", "application/x-yaml", "application/yaml",
                        "application/toml", "application/javascript", "application/x-sh", "application/x-ndjson"})


class InputFileError(ValueError):
    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def _is_text(mime: str) -> bool:
    mime = mime.split(";")[0].strip().lower()
    return mime.startswith("text/") or mime in TEXT_TYPES or mime.endswith(("+json", "+xml"))


def input_file_text(part: dict[str, Any], param: str) -> str:
    """The text the model sees for one `input_file` part at `param` (InputFileError naming the field)."""
    for unsupported in ("file_id", "file_url"):
        if part.get(unsupported):
            raise InputFileError(f"input_file with {unsupported} is not supported: send the file inline as "
                                 "file_data (a base64 data URL of a text file).", f"{param}.{unsupported}")
    data, filename = part.get("file_data"), part.get("filename") or "file"
    if not isinstance(data, str) or not data:
        raise InputFileError("input_file needs file_data (a base64 data URL of a text file).", f"{param}.file_data")
    mime = mimetypes.guess_type(filename)[0] or ""
    if data.startswith("data:"):
        header, _, data = data.partition(",")
        if not header.endswith(";base64"):
            raise InputFileError("input_file file_data must be a base64 data URL (data:<type>;base64,...).",
                                 f"{param}.file_data")
        mime = header[len("data:"):-len(";base64")] or mime
    if not _is_text(mime):
        raise InputFileError(f"input_file of type {mime or 'unknown'!r} ({filename}) cannot be sent to this "
                             "model: only text files are supported (text/*, JSON, XML, YAML, ...).",
                             f"{param}.file_data")
    try:
        text = base64.b64decode(data, validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        raise InputFileError(f"input_file {filename}: file_data is not base64 of UTF-8 text.",
                             f"{param}.file_data") from None
    return f"{filename}:\n{text}"
