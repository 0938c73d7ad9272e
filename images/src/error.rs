//! Errors of image building.

use std::path::{Path, PathBuf};

/// Errors of image building.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// An external tool failed.
    #[error("{tool} failed: {detail}")]
    Tool {
        /// The command.
        tool: String,
        /// Its last error lines.
        detail: String,
    },
    /// A package could not be resolved.
    #[error("cannot resolve packages: {0}")]
    Resolve(String),
}

impl Error {
    pub(crate) fn io(path: impl AsRef<Path>, source: std::io::Error) -> Error {
        Error::Io {
            path: path.as_ref().to_path_buf(),
            source,
        }
    }
}
