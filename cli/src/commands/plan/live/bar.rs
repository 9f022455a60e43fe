//! The terminal `plan watch`'s progress bar is drawn on, for `indicatif`.

use std::{
    fmt,
    io::{self, Write},
    sync::Mutex,
};

use indicatif::TermLike;

/// The bar line: `[#########---------------] ` then [`progress_text`] and
/// the pace, cut to the terminal width.
pub(super) const BAR_TEMPLATE: &str = "[{bar:24}] {wide_msg}";

/// The bar's terminal for `indicatif`: `width` columns behind a writer
/// (stdout; a buffer in tests), moved about with ANSI escape sequences.
pub(super) struct BarTerm {
    /// Terminal columns.
    pub(super) width: u16,
    /// Where the bar is drawn.
    pub(super) out: Mutex<Box<dyn Write + Send>>,
}

impl BarTerm {
    fn write(&self, text: &str) -> io::Result<()> {
        let mut out = self
            .out
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        out.write_all(text.as_bytes())
    }

    fn move_cursor(&self, count: usize, direction: char) -> io::Result<()> {
        if count == 0 {
            return Ok(());
        }
        self.write(&format!("\x1b[{count}{direction}"))
    }
}

impl fmt::Debug for BarTerm {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("BarTerm")
            .field("width", &self.width)
            .finish_non_exhaustive()
    }
}

impl TermLike for BarTerm {
    fn width(&self) -> u16 {
        self.width
    }
    fn move_cursor_up(&self, count: usize) -> io::Result<()> {
        self.move_cursor(count, 'A')
    }
    fn move_cursor_down(&self, count: usize) -> io::Result<()> {
        self.move_cursor(count, 'B')
    }
    fn move_cursor_right(&self, count: usize) -> io::Result<()> {
        self.move_cursor(count, 'C')
    }
    fn move_cursor_left(&self, count: usize) -> io::Result<()> {
        self.move_cursor(count, 'D')
    }
    fn write_line(&self, line: &str) -> io::Result<()> {
        self.write(line)?;
        self.write("\n")
    }
    fn write_str(&self, text: &str) -> io::Result<()> {
        self.write(text)
    }
    fn clear_line(&self) -> io::Result<()> {
        self.write("\r\x1b[2K")
    }
    fn flush(&self) -> io::Result<()> {
        let mut out = self
            .out
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        out.flush()
    }
}
