use std::fmt;

/// A configuration error, worded like nginx's own messages (nginx prefixes `[emerg]` and appends
/// ` in FILE:LINE`). The text never contains anything but directive arguments the user wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfError(String);

impl ConfError {
    /// An error with this exact text.
    pub fn new(text: impl Into<String>) -> Self {
        ConfError(text.into())
    }

    /// The message text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ConfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfError {}

/// Shows a directive argument the way nginx quotes it in messages.
pub(crate) fn show(arg: &[u8]) -> String {
    String::from_utf8_lossy(arg).into_owned()
}
