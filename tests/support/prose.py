"""Real prose to shingle: news articles and technical paragraphs, embedded so the tests need nothing
outside the repository."""

from __future__ import annotations

# A wedding-planner sports story (news, ~2 KB).
ROMO = (
    "NFC East rival quarterbacks Tony Romo of the Dallas Cowboys and Eli Manning of the New York Giants "
    "now have something else in common — they've used the same wedding planner to help them tie the "
    'knot. Todd Fiscus, the man with the plan, set up what he called "man food" at Dallas\' Arlington '
    'Hall on Saturday, when Romo married former Miss Missouri Candace Crawford. "I have a lot of '
    'football players to feed," said Fiscus, who had pizza and short ribs on the menu.\n\n'
    'However, Romo apparently put all the tunes together. "Tony picked out every song, and when it '
    'plays, and what the keynote things are," Fiscus said.\n\n'
    "Sounds like a very orderly occasion, but there was one wild card — whether Cowboys owner Jerry "
    "Jones would be able to attend. With the continued lockout, owners and players are not supposed to "
    "have any contact away from the negotiating table. But Jones received special dispensation from the "
    "NFL to attend, just as the Green Bay Packers recently were informed that they will, in fact, "
    "receive their Super Bowl rings in a June 16 ceremony no matter what the labor situation is at that "
    "time. Jones was there along with virtually all of Romo's teammates.\n\n"
    "It is unknown whether Jones and Romo actually discussed any labor issues at the wedding — we're "
    'guessing this was more of a "friendly", though Jones is one of the most powerful owners on the '
    "NFL's side of things and Romo's marquee value gives him a lot of play on the other side.\n\n"
    "Romo, who had been linked romantically before with Jessica Simpson and Carrie Underwood, proposed "
    "to Crawford last December. According to the new Mrs. Romo, the lockout may play a part in the "
    "couple's plans for a honeymoon; usually around this time of year, her husband would be "
    "participating in minicamps and other off-season workouts."
)

# A holiday explainer (news, ~1.6 KB).
MEMORIAL = (
    "Officially, Memorial Day, observed on the last Monday of May (this year it's May 30), honors the "
    "war dead. Unofficially, the day honors the start of summer.\n\n"
    'The upcoming three-day weekend has prompted searches for "when is memorial day," "what is '
    'memorial day," and "memorial day history." The day was originally known as "Decoration Day" '
    "because the day was dedicated to the Civil War dead, when mourners would decorate gravesites as a "
    "remembrance.\n\n"
    "The holiday was first widely observed on May 30, 1868, when 5,000 people helped decorate the "
    "gravesites of 20,000 Union and Confederate soldiers buried at Arlington National Cemetery. After "
    "World War I, the observances were widened to honor the fallen from all American wars, and in 1971, "
    "Congress declared Memorial Day a national holiday.\n\n"
    "Towns across the country now honor military personnel with services, parades, and fireworks. A "
    "national moment of remembrance takes place at 3 p.m. This day is not to be confused with Veterans "
    "Day, which is observed on November 11 to honor military veterans, both alive and dead. However, "
    "confusion abounds anyway, with the weekend marking for many the kickoff of summer, and it is "
    "reserved for weekend getaways, picnics, and sales."
)

SHINGLING = (
    "Finding duplicate files is easy, anyone can do it. Finding files that are almost identical is more "
    "difficult, but it's useful for use cases like detecting plagiarism. The basic idea is to reduce "
    "each document to a set of strings and then use Jaccard similarity to calculate the similarity of "
    "those sets. To reduce a document to a set of strings, we use a technique called shingling. "
    "Shingling extracts the set of all substrings of length k (called k-shingles) from a text. This is "
    "implemented by sliding a window of size k over the input document character by character and "
    "throwing the substrings into a set. Jaccard similarity is a simple measure for expressing "
    "similarity of sets. I first came across this measure when studying recommender systems, but it "
    "keeps showing up in other machine learning contexts, too. Obviously, plagiarized documents have a "
    "higher similarity to the original than unrelated documents."
)

NEAR_DUPLICATES = (
    "Most real-world duplication is not exact. Articles get paraphrased, headlines change, paragraphs "
    "get reordered, and syndication services add or remove bylines and footers. To catch these "
    "near-duplicates, you need a similarity measure that tolerates small differences. The choice of "
    "character-level shingles rather than word-level n-grams is deliberate. Word-level shingles are "
    "sensitive to tokenization choices and vocabulary differences across languages. Character-level "
    "shingles are language-agnostic and naturally capture morphological variations. They also "
    "gracefully handle misspellings and OCR errors, where individual words may differ but most "
    "character sequences remain shared. The problem with computing Jaccard similarity directly is the "
    "cost: for a corpus of N documents, a naive pairwise comparison requires a quadratic number of "
    "similarity computations."
)

BANDING = (
    "Locality sensitive hashing is a widely popular technique used in approximate nearest neighbor "
    "search. It uses an approximate search principle to get better performance while maintaining the "
    "quality of the results. At its core, the final LSH function allows us to segment and hash the same "
    "sample several times, and when we find that a pair of vectors has been hashed to the same value at "
    "least once, we tag them as candidate pairs, that is, potential matches. The signature matrix is "
    "divided into b bands of r rows each; for each band we hash its portion of the column into a "
    "bucket. The results are verified by actually checking whether those documents have similarity "
    "above the threshold, and the top three similar documents are returned with statistics."
)

PROSE: tuple[str, ...] = (ROMO, MEMORIAL, SHINGLING, NEAR_DUPLICATES, BANDING)
