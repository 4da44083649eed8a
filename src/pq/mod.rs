//! The PQCache decode-step indexer (spec: `spec/pqcache-indexer.md` in the shared docs).
