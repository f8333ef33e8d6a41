"""The EAGLE head's prompt set: hand-written templates x topics, split by topic so held-out prompts share no
topic with training prompts. Deterministic: `python -m bench.eagle_prompts` rewrites bench/data/eagle_prompts.json."""
from __future__ import annotations

import json
import random
from pathlib import Path

PATH = Path(__file__).parent / "data" / "eagle_prompts.json"

CHAT = ["Give me three practical tips for {a}.", "How can I get better at {a}?",
        "What are common mistakes people make when {a}?", "I want to start {a}. Where should I begin?",
        "What are the pros and cons of {a}?", "Write a short motivational message about {a}."]
ACTIVITIES = ["learning a new language", "running a marathon", "saving money", "cooking at home", "working from home",
              "public speaking", "gardening", "learning to play the guitar", "writing a novel", "sleeping better",
              "managing stress", "traveling on a budget", "taking notes in class", "keeping a journal",
              "making friends in a new city", "learning to swim", "reading more books", "staying hydrated",
              "painting with watercolors", "training a puppy", "preparing for a job interview", "meditating",
              "cycling to work", "decluttering a home", "learning chess", "baking bread", "studying for exams",
              "hiking in the mountains", "volunteering", "learning photography"]
EXPLAIN = ["Explain {c} in simple terms.", "What is {c}? Answer in a short paragraph.", "Describe how {c} works.",
           "Explain {c} to a ten-year-old.", "Why is {c} important?", "Give a short definition of {c} and one example."]
CONCEPTS = ["photosynthesis", "gravity", "inflation", "the water cycle", "machine learning", "a black hole",
            "the immune system", "compound interest", "climate change", "electricity", "DNA", "the internet",
            "democracy", "evolution", "a volcano", "recycling", "the stock market", "vaccines", "renewable energy",
            "an earthquake", "supply and demand", "the moon's phases", "a rainbow", "blockchain", "the heart",
            "a computer processor", "encryption", "tides", "friction", "the greenhouse effect"]
CODE = ["Write a Python function that {t}.", "Write a Python function that {t}, with a docstring.",
        "Write a JavaScript function that {t}.", "Show how to {t} in Python, with a short explanation.",
        "Write a Python function that {t} and a simple test for it."]
TASKS = ["reverses a string", "checks whether a number is prime", "returns the n-th Fibonacci number",
         "counts the vowels in a string", "finds the largest element in a list", "removes duplicates from a list",
         "checks whether a string is a palindrome", "sorts a list of dictionaries by a key",
         "computes the average of a list of numbers", "converts Celsius to Fahrenheit",
         "reads a text file and counts its lines", "flattens a nested list",
         "computes the greatest common divisor of two numbers", "returns the squares of the even numbers in a list",
         "capitalizes every word in a sentence", "checks whether two strings are anagrams",
         "computes the sum of the digits of an integer", "finds the second smallest number in a list",
         "counts word frequencies in a text", "validates an email address with a regular expression",
         "implements binary search", "converts a binary string to an integer", "transposes a matrix",
         "merges two dictionaries", "generates all permutations of a list"]
LISTS = ["List five {x}.", "Name three {x} and describe each in one sentence.", "Give me a list of {x}.",
         "What are some {x}?"]
THINGS = ["healthy breakfast ideas", "famous scientists", "fun indoor activities for kids",
          "ways to reduce plastic waste", "programming languages for beginners", "board games for families",
          "tips for a good resume", "European capitals", "exercises you can do at home", "benefits of regular exercise",
          "classic novels", "houseplants that are easy to care for", "ways to save energy at home",
          "vegetables that grow well in pots", "questions to ask in a job interview", "ideas for a birthday party",
          "simple science experiments", "uses of a spreadsheet", "good habits for programmers",
          "things to pack for a camping trip"]
REWRITE = ["Rewrite this sentence in a more formal tone: {s}", "Fix the grammar in this sentence: {s}",
           "Translate this sentence into simple English: {s}", "Make this sentence shorter: {s}",
           "Rewrite this sentence in the past tense: {s}", "Summarize this in a few words: {s}"]
SENTENCES = ["me and my friend goes to the park every weekend because we likes the fresh air.",
             "The meeting has been moved to Thursday because the manager is traveling this week.",
             "I can't believe how fast the summer went, it feels like it just started yesterday.",
             "The new library downtown opens at nine and closes at six on weekdays.",
             "Our team finished the project two days early thanks to good planning and hard work.",
             "He don't like coffee but he drink tea every morning before work.",
             "The weather was so bad that the football match was cancelled at the last minute.",
             "Students must submit their essays by Friday or they will lose points.",
             "She walks her dog in the morning and reads the newspaper in the evening.",
             "The restaurant on the corner serves the best pizza in town, according to my neighbours.",
             "We are going to visit my grandparents next month if the trains are running.",
             "The software update fixes several bugs and makes the app start faster.",
             "They has been waiting for the bus for over an hour in the rain.",
             "Please remember to turn off the lights when you leave the office.",
             "The museum is offering free entry to children under twelve this summer."]
CREATIVE = ["Write a short poem about {p}.", "Write a haiku about {p}.",
            "Write a short story about {p} in three sentences.", "Write a product description for {p}."]
PICTURES = ["the ocean", "a rainy day", "a lost cat", "autumn leaves", "a city at night", "a friendly robot",
            "the first day of school", "a cup of coffee", "a mountain lake", "a old lighthouse", "a busy kitchen",
            "a snowy forest", "a hot air balloon", "a pair of running shoes", "a reusable water bottle"]

GROUPS = [("chat", CHAT, "a", ACTIVITIES), ("explain", EXPLAIN, "c", CONCEPTS), ("code", CODE, "t", TASKS),
          ("list", LISTS, "x", THINGS), ("rewrite", REWRITE, "s", SENTENCES), ("creative", CREATIVE, "p", PICTURES)]


def split_topics(rng: random.Random, held_out_share: float = 0.15):
    """(kind, templates, slot, training topics, held-out topics) per group, split in the order of `rng`."""
    for kind, templates, slot, topics in GROUPS:
        topics = list(topics)
        rng.shuffle(topics)
        n_held = max(2, round(len(topics) * held_out_share))
        yield kind, templates, slot, topics[n_held:], topics[:n_held]


def build(held_out_share: float = 0.15, seed: int = 0) -> dict:
    """All template x topic prompts, split by topic: a held-out topic never appears in a training prompt."""
    rng = random.Random(seed)
    train, held_out = [], []
    for kind, templates, slot, train_topics, held_topics in split_topics(rng, held_out_share):
        held_out += [{"kind": kind, "text": t.format(**{slot: topic})} for topic in held_topics for t in templates]
        train += [{"kind": kind, "text": t.format(**{slot: topic})} for topic in train_topics for t in templates]
    rng.shuffle(train)
    rng.shuffle(held_out)
    return {"train": train, "held_out": held_out}


def held_out_topics(held_out_share: float = 0.15, seed: int = 0) -> list[str]:
    """The topics of the held-out prompts (what self-written training prompts must not mention)."""
    return [topic for *_, held in split_topics(random.Random(seed), held_out_share) for topic in held]


# Looser stems of the held-out topics and the benchmark's own chat and code prompts (spec_engine.bench.PROMPTS):
# a self-written training prompt that mentions one is dropped, so held-out and benchmark results stay outside training.
EXCLUDED_STEMS = ["watercolo", "hydrat", "stress", "democra", "machine learning", "water cycle", "electric",
                  "permutation", "reverse a string", "reversing a string", "word frequenc", "email", "vegetables",
                  "habits for programmers", "resume", "first day of school", "mountain lake", "cooking at home",
                  "focus", "studying", "sorted list", "merge", "bicycle", "spelling"]


def excluded_phrases() -> list[str]:
    """Lower-case phrases a self-written training prompt must not contain."""
    articles = ("the ", "a ", "an ")
    topics = [t.lower().removeprefix(next((a for a in articles if t.lower().startswith(a)), ""))
              for t in held_out_topics()]
    return sorted(set(topics + EXCLUDED_STEMS))


if __name__ == "__main__":
    data = build()
    PATH.parent.mkdir(parents=True, exist_ok=True)
    PATH.write_text(json.dumps(data, indent=0) + "\n")
    print(f"{len(data['train'])} train, {len(data['held_out'])} held-out prompts -> {PATH}")
