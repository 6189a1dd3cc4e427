"""A stored response's input items, as OpenAI lists them (GET /v1/responses/{id}/input_items).

A response's input items are everything its prompt was built from but its instructions: the conversation of its
`previous_response_id` (the earlier turns' inputs and answers, each answer under the id its response gave it),
then its own input. Each item is a message in OpenAI's item shape, with an id given when it was stored, so a
client pages through them with `after` as it does on OpenAI (`client.responses.input_items.list(id)`).
"""
from __future__ import annotations

from typing import Any, Literal, Optional

from core.server.errors import APIError

DEFAULT_LIMIT, MAX_LIMIT = 20, 100    # OpenAI's page size: 20 unless asked, 1 to 100
Order = Literal["asc", "desc"]
LIST_PARAMS = ("limit", "order", "after", "include", "include[]")    # include[]: how the openai client sends it


def check_list_query(query: Any) -> None:
    """400 for a query parameter the list does not take, or an `include` (no item here has what it names)."""
    unknown = [k for k in query.keys() if k not in LIST_PARAMS]
    if unknown:
        raise APIError(400, f"unknown query parameter {unknown[0]!r}; input_items takes {', '.join(LIST_PARAMS[:4])}",
                       unknown[0], "unknown_parameter")
    asked = [v for k in ("include", "include[]") for v in query.getlist(k)]
    if asked:
        raise APIError(400, f"include is not supported: these items hold text only, no image URLs, logprobs or "
                            f"tool outputs to include (got {asked[0][:80]!r}); leave include out", "include",
                       "unsupported_parameter")


def input_item(message: dict[str, str], item_id: str) -> dict:
    """One stored message as OpenAI's item: an assistant turn as an output message (output_text), any other role
    as an input message (input_text)."""
    if message["role"] == "assistant":
        part = {"type": "output_text", "text": message["content"], "annotations": [], "logprobs": []}
    else:
        part = {"type": "input_text", "text": message["content"]}
    return {"id": item_id, "type": "message", "role": message["role"], "status": "completed", "content": [part]}


def page(items: list[dict], limit: int, order: Order, after: Optional[str]) -> dict:
    """OpenAI's list object for one page of `items` (oldest first): in `order`, starting after the item `after`."""
    ordered = items if order == "asc" else items[::-1]
    start = 0
    if after is not None:
        ids = [item["id"] for item in ordered]
        if after not in ids:
            raise APIError(400, f"after {after!r} is not an input item of this response; send the id of an item "
                                f"an earlier page listed (its last_id)", "after", "invalid_value")
        start = ids.index(after) + 1
    data = ordered[start:start + limit]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": start + limit < len(ordered)}
