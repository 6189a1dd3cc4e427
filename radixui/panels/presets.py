"""Prompt presets for live demos: each shares a prefix in a different way."""
from __future__ import annotations

from core.engine.walkthrough import ARTICLE_PROMPTS

SYSTEM_PROMPT = ("You are a patient teaching assistant for a course on large language model serving. "
                 "Answer in two short sentences, use plain words, and give one concrete example.")
FEW_SHOT = ("Classify the sentiment of each review as positive or negative.\n"
            "Review: The battery lasts all day and the screen is gorgeous.\nSentiment: positive\n"
            "Review: It stopped working after a week and support never answered.\nSentiment: negative\n"
            "Review: Setup took two minutes and it just works.\nSentiment: positive\n")

# name -> (mode, list of prompts); chat prompts are message lists
PRESETS: dict[str, tuple[str, list]] = {
    "Chats sharing a system prompt": ("chat", [
        [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": q}]
        for q in ("What is a KV cache?", "Why does prefix caching save time?",
                  "What is a radix tree?", "When does a cache evict an entry?")]),
    "Few-shot prompts": ("raw", [FEW_SHOT + f"Review: {r}\nSentiment:" for r in (
        "The fan is loud and the case feels cheap.", "Best purchase I made this year.",
        "Arrived broken and the refund took a month.")]),
    "The article's four prompts": ("raw", list(ARTICLE_PROMPTS)),
}
