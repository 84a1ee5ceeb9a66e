"""The semantic cache's evaluation set: pairs of single-turn questions that one answer
serves (paraphrases), and near misses that one answer must never serve: they differ in
a number, a negation, or the system prompt."""

PARAPHRASES = [
    ("What is the capital of France?", "What's the capital city of France?"),
    ("How do I reverse a list in Python?", "How can I reverse a Python list?"),
    ("Explain photosynthesis in simple terms.", "Explain photosynthesis simply."),
    ("What is the boiling point of water?", "At what temperature does water boil?"),
    ("Who wrote Pride and Prejudice?", "Who is the author of Pride and Prejudice?"),
    ("Translate 'good morning' into Spanish.", "How do you say 'good morning' in Spanish?"),
    ("What causes the seasons on Earth?", "Why does Earth have seasons?"),
    ("Give me a synonym for happy.", "What is a synonym for happy?"),
    ("How many legs does a spider have?", "How many legs do spiders have?"),
    (
        "What is the largest planet in the solar system?",
        "Which planet is the biggest in our solar system?",
    ),
    ("Summarize the plot of Hamlet.", "Give me a summary of Hamlet's plot."),
    ("What does HTTP stand for?", "What is HTTP short for?"),
    ("How do I make a cup of tea?", "How do you make a cup of tea?"),
    ("What is the speed of light?", "How fast does light travel?"),
    ("Recommend a good book about history.", "Can you recommend a good history book?"),
    ("What is machine learning?", "Can you explain what machine learning is?"),
    ("How do I center a div in CSS?", "How can I center a div with CSS?"),
    ("What is the chemical symbol for gold?", "Which chemical symbol does gold have?"),
    ("Why is the sky blue?", "What makes the sky blue?"),
    ("List the primary colors.", "What are the primary colors?"),
]

NUMBER_MISSES = [
    ("What is 2 + 2?", "What is 2 + 3?"),
    ("Convert 10 miles to kilometers.", "Convert 12 miles to kilometers."),
    ("What happened in 1914?", "What happened in 1941?"),
    ("Write a haiku with 3 lines.", "Write a haiku with 5 lines."),
    ("Give me 5 ideas for dinner.", "Give me 10 ideas for dinner."),
    ("What is the square root of 16?", "What is the square root of 64?"),
    ("Round 3.14159 to 2 decimal places.", "Round 3.14159 to 3 decimal places."),
    ("Is 17 a prime number?", "Is 21 a prime number?"),
]

NEGATION_MISSES = [
    ("Is Paris the capital of France?", "Is Paris not the capital of France?"),
    ("Should I use tabs for indentation?", "Should I not use tabs for indentation?"),
    ("List foods that contain gluten.", "List foods that do not contain gluten."),
    ("Why do cats like water?", "Why don't cats like water?"),
    ("Write a sentence with the word always.", "Write a sentence without the word always."),
    ("Which animals can fly?", "Which animals cannot fly?"),
    ("Is coffee good for you?", "Is coffee never good for you?"),
    ("Name countries that use the euro.", "Name countries that don't use the euro."),
]

SYSTEM_MISSES = [
    ("You are a helpful assistant.", "Answer in French.", "What is the capital of France?"),
    ("Answer in one word.", "Answer in detail.", "Why is the sky blue?"),
    ("You are a pirate.", "You are a lawyer.", "How do I make a cup of tea?"),
    ("Reply in JSON.", "Reply in YAML.", "List the primary colors."),
]
"""(one system prompt, another, the same question): another bucket, by construction."""
