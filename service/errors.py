"""The root of neardup's exceptions: `except neardup.Error` catches every error neardup raises of its
own. Most also derive from a built-in exception (InvalidMessage is a ValueError too), so code that
catches that one works as well.

    Error
    ├── InvalidMessage (ValueError)      input the worker dead-letters; `.reason` is the reason
    ├── EmptyText (ValueError)           nothing is left of a text after normalization
    ├── IncompatibleState                a state of another format or other signing parameters
    ├── StateError                       a state directory that cannot be used (locked, unreadable)
    ├── CorruptRecord (ValueError)       a stored record that cannot be decoded
    ├── DecisionFailed (RuntimeError)    the library's index failed on one article (the log has why)
    ├── ConfigError (ValueError)         a setting the worker cannot run with
    ├── ResumeMismatch (RuntimeError)    a resumed `neardup dedup` whose state and output disagree
    ├── SigningFailed (RuntimeError)     `neardup dedup`'s signing helpers cannot start
    ├── SignerFailed (RuntimeError)      the worker's signing helpers cannot start
    ├── DeciderFailed (RuntimeError)     the worker's decider process failed twice on a batch
    ├── ChildFailed (RuntimeError)       a helper process exited or answered garbage
    │   └── ChildTimedOut                ... or did not answer in time, and was killed
    ├── TopicMismatch (RuntimeError)     a topic's partition count or size limit the worker cannot use
    ├── Fenced (RuntimeError)            under exactly-once, another worker took a transactional id
    ├── Ended (RuntimeError)             under exactly-once, a writer's transaction aborted (or what
    │                                    follows a commit failed): the writer commits nothing more
    ├── BrokerUnreachable                a client cannot connect at its start (also aiokafka's
    │                                    KafkaConnectionError); says where, how and as whom
    └── TooLong (ValueError)             a text normalisation expands past its limit (dead-lettered
                                         as oversized; the library raises InvalidMessage)

The library (`neardup.open`, Deduplicator) raises InvalidMessage, IncompatibleState, StateError,
CorruptRecord and DecisionFailed; the package exports those, ConfigError and Error. A ValueError or
TypeError not on this list is a programming error (a bad argument), not a refused input.
"""

from __future__ import annotations


class Error(Exception):
    """Base class of every exception neardup defines."""
