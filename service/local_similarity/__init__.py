"""Local similarity: the passage-level report of `neardup compare --local`, a product of its own
beside the engine, which never uses it.

After Stein & Meyer zu Eissen (2006), who call similarity measured passage by passage "local"
(φ_local) as opposed to the global similarity of whole texts. The name follows theirs and the
`--local` flag that asks for it. It is not "passages": the engine finds passages too (the anchors'
`Passage` that a verdict names), and a package of that name would read as theirs.

terms.py       tokens, stopwords and stems of a text (the report's own tokenizer)
fingerprint.py chunk identity: n-word chunk digests and the verbatim passages they reveal
fuzzy.py       fuzzy-fingerprints over prefix classes of index terms
vsm.py         the global cosine those fingerprints approximate
compare.py     the measures of a pair of texts, each alone or all at once (compare_local)
report.py      the terminal report, with the engine's anchor passages beside the verbatim ones

The engine's modules (core/, pipeline/, state/, stream/) never import this package. It imports
from core/ only what it reuses from the engine and would otherwise duplicate: the 64-bit finalizer
and the set measures' conventions for empty sets, and, in the report, the anchors, the number of
passages a verdict names and the canonical form, so that the report shows what a verdict would.
"""
