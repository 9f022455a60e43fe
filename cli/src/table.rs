//! Tables for people, fitted to the terminal.
//!
//! A table is laid out for a width: the terminal's when stdout is one, else
//! `COLUMNS` when set, else 80 (as `ps` does), so `redrivectl ... | less`
//! reads like the terminal. To fit it, in this order:
//!
//! 1. Columns marked [`Column::optional`] are left out, right-most first
//!    (then those that fit after all come back). A wider terminal or `--wide`
//!    shows them.
//! 2. Columns of free text ([`Column::shorten`]: sources, keys, names,
//!    reasons) are shortened, each to at least its header's width, with an
//!    ellipsis `…` marking the cut. Ids, times, counts and state names
//!    ([`Column::keep`]) are never cut: they are what people copy.
//! 3. Headers are never broken inside a word; only when the table does not
//!    fit otherwise are they stacked at their underscores
//!    (`ALREADY` over `REPLAYED`).
//! 4. A table that is still too wide (many counts side by side) is printed
//!    as several tables, one under the other, each starting with the first
//!    column.
//!
//! With `--wide` ([`set_width`] `None`) every column is shown with its full
//! values, however long the lines get. Every row is one line: control
//! characters in a cell, line breaks and tabs included, are written as
//! visible escapes ([`crate::escape::visible`], `\n`, `\t`), so columns stay
//! aligned and producers' escape sequences stay off the terminal.
//!
//! The layout (which widths, which columns) is computed here; drawing and
//! cutting with the ellipsis are `comfy-table`'s (column constraints, rows of
//! at most one line).

use std::{
    cell::Cell as StdCell,
    io::{self, Write},
};

use comfy_table::{ColumnConstraint, ContentArrangement, Row, Table as Comfy, Width, presets};

/// The width tables are laid out for when nothing else says (no terminal,
/// no `COLUMNS`).
pub const DEFAULT_WIDTH: u16 = 80;

/// What is printed where a cell is cut.
pub const ELLIPSIS: &str = "…";

/// Spaces between two columns.
const GAP: usize = 2;

thread_local! {
    /// The width tables are laid out for; `None`: `--wide`, no limit.
    static WIDTH: StdCell<Option<u16>> = const { StdCell::new(Some(DEFAULT_WIDTH)) };
}

/// Sets the width the tables of this thread are laid out for: `None` for
/// `--wide` (full values, no limit). [`crate::run`] sets it once, from
/// [`width_for`].
pub fn set_width(width: Option<u16>) {
    WIDTH.with(|cell| cell.set(width));
}

/// The width tables are laid out for now ([`set_width`]).
pub fn width() -> Option<u16> {
    WIDTH.with(StdCell::get)
}

/// The layout width: `None` with `--wide`; else the terminal's width, else
/// `COLUMNS` (a positive number), else [`DEFAULT_WIDTH`].
pub fn width_for(wide: bool, terminal: Option<u16>, columns: Option<&str>) -> Option<u16> {
    if wide {
        return None;
    }
    Some(
        terminal
            .filter(|width| *width > 0)
            .or_else(|| {
                columns
                    .and_then(|text| text.trim().parse::<u16>().ok())
                    .filter(|width| *width > 0)
            })
            .unwrap_or(DEFAULT_WIDTH),
    )
}

/// One column: its header (written upper-case) and how it gives way when the
/// table is too wide (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Column {
    /// The header, lower-case with underscores (`message_key`).
    pub name: &'static str,
    /// Free text that may be cut with an ellipsis.
    pub shorten: bool,
    /// Left out when the table does not fit otherwise.
    pub optional: bool,
}

impl Column {
    /// A column never cut: ids, times, state and verdict names.
    pub const fn keep(name: &'static str) -> Self {
        Self {
            name,
            shorten: false,
            optional: false,
        }
    }

    /// A column of free text, cut with an ellipsis when the table is too
    /// wide (never below its header's width).
    pub const fn shorten(name: &'static str) -> Self {
        Self {
            shorten: true,
            ..Self::keep(name)
        }
    }

    /// This column may be left out when the table does not fit otherwise.
    pub const fn optional(self) -> Self {
        Self {
            optional: true,
            ..self
        }
    }
}

/// A table being filled: columns, then rows of cells in column order.
#[derive(Debug, Clone)]
pub struct Table {
    columns: Vec<Column>,
    rows: Vec<Vec<String>>,
}

/// A new table with these columns.
pub fn table(columns: &[Column]) -> Table {
    Table {
        columns: columns.to_vec(),
        rows: Vec::new(),
    }
}

impl Table {
    /// Adds one row, its cells in column order.
    pub fn add_row<S: AsRef<str>>(&mut self, row: impl IntoIterator<Item = S>) -> &mut Self {
        self.rows.push(
            row.into_iter()
                .map(|text| one_line(text.as_ref()))
                .collect(),
        );
        self
    }

    /// Adds rows.
    pub fn add_rows<R, S>(&mut self, rows: impl IntoIterator<Item = R>) -> &mut Self
    where
        R: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        for row in rows {
            self.add_row(row);
        }
        self
    }

    /// The lines of the table laid out for `width` (`None`: full values),
    /// without trailing blanks.
    pub fn lines_for(&self, width: Option<u16>) -> Vec<String> {
        let layout = width.map(|width| self.layout(usize::from(width)));
        if let (Some(width), Some(layout)) = (width, &layout)
            && layout.total > usize::from(width)
            && self.columns.len() > 2
        {
            return self.split_lines(width);
        }
        let mut comfy = Comfy::new();
        comfy
            .load_preset(presets::NOTHING)
            .set_truncation_indicator(ELLIPSIS);
        let header = |column: &Column, stacked: bool| {
            let name = column.name.to_uppercase();
            if stacked {
                name.replace('_', "\n")
            } else {
                name
            }
        };
        let stacked = layout.as_ref().is_some_and(|layout| layout.stacked);
        comfy.set_header(
            self.columns
                .iter()
                .map(|column| header(column, stacked))
                .collect::<Vec<_>>(),
        );
        for cells in &self.rows {
            let mut row = Row::from(cells.clone());
            row.max_height(1);
            comfy.add_row(row);
        }
        match &layout {
            None => {
                comfy.set_content_arrangement(ContentArrangement::Disabled);
            }
            Some(layout) => {
                comfy
                    .set_content_arrangement(ContentArrangement::Dynamic)
                    // Room for the outer padding, trimmed when written.
                    .set_width(u16::try_from(layout.total + GAP).unwrap_or(u16::MAX));
                comfy.set_constraints(layout.widths.iter().map(|width| match width {
                    None => ColumnConstraint::Hidden,
                    // comfy-table's width includes the padding.
                    Some(width) => ColumnConstraint::Absolute(Width::Fixed(
                        u16::try_from(*width + GAP).unwrap_or(u16::MAX),
                    )),
                }));
            }
        }
        comfy
            .lines()
            .map(|line| {
                let line = line.trim_end();
                line.strip_prefix(' ').unwrap_or(line).to_owned()
            })
            .collect()
    }

    /// A table too wide even at its least (many columns that are never cut)
    /// as several tables one under the other, each with the first column
    /// (what the rows are) and as many of the others as fit with their
    /// headers on one line; optional columns are left out.
    fn split_lines(&self, width: u16) -> Vec<String> {
        // Each part with its headers on one line.
        let fits = |columns: &[usize]| {
            let layout = self.part(columns).layout(usize::from(width));
            layout.total <= usize::from(width) && !layout.stacked
        };
        let mut parts: Vec<Vec<usize>> = vec![vec![0]];
        for index in 1..self.columns.len() {
            if self.columns[index].optional {
                continue;
            }
            let last = parts.last_mut().expect("one part at least");
            last.push(index);
            if last.len() > 2 && !fits(last) {
                last.pop();
                parts.push(vec![0, index]);
            }
        }
        let mut lines = Vec::new();
        for (number, columns) in parts.iter().enumerate() {
            if number > 0 {
                lines.push(String::new());
            }
            lines.extend(self.part(columns).lines_for(Some(width)));
        }
        lines
    }

    /// These columns of the table, with their cells.
    fn part(&self, columns: &[usize]) -> Self {
        Self {
            columns: columns.iter().map(|index| self.columns[*index]).collect(),
            rows: self
                .rows
                .iter()
                .map(|row| {
                    columns
                        .iter()
                        .map(|index| row.get(*index).cloned().unwrap_or_default())
                        .collect()
                })
                .collect(),
        }
    }

    /// Which columns are shown and how wide, for `width` (module docs).
    fn layout(&self, width: usize) -> Layout {
        let content = self.content_widths();
        let optional: Vec<bool> = self.columns.iter().map(|column| column.optional).collect();
        let (shown, stacked) = self.choose_shown(&content, &optional, width);
        let bound = self.bounds(&content, stacked);
        let widths = share_out(&bound, &shown, &optional, width);
        let shown_widths: Vec<usize> = widths.iter().flatten().copied().collect();
        let total = shown_widths.iter().sum::<usize>() + GAP * shown_widths.len().saturating_sub(1);
        Layout {
            widths,
            stacked,
            total,
        }
    }

    /// The widest cell of each column, in terminal columns.
    fn content_widths(&self) -> Vec<usize> {
        (0..self.columns.len())
            .map(|index| {
                self.rows
                    .iter()
                    .filter_map(|row| row.get(index))
                    .map(|text| display_width(text))
                    .max()
                    .unwrap_or(0)
            })
            .collect()
    }

    /// (full width, least width) of each column, its header on one line or
    /// `stacked` at underscores; `content`: the widest cell of each.
    fn bounds(&self, content: &[usize], stacked: bool) -> Vec<(usize, usize)> {
        self.columns
            .iter()
            .zip(content)
            .map(|(column, content)| {
                let header = if stacked {
                    column.name.split('_').map(str::len).max().unwrap_or(0)
                } else {
                    column.name.len()
                };
                let full = header.max(*content);
                (full, if column.shorten { header } else { full })
            })
            .collect()
    }

    /// Which columns are shown within `width`, and whether headers stack:
    /// every column when all fit in full; else the required columns (their
    /// headers stacked when even their least widths do not fit), then each
    /// optional one, left-most first, only while the required ones keep
    /// their full width.
    fn choose_shown(
        &self,
        content: &[usize],
        optional: &[bool],
        width: usize,
    ) -> (Vec<bool>, bool) {
        let mut stacked = false;
        let mut bound = self.bounds(content, false);
        let mut shown = vec![true; self.columns.len()];
        if width_of(&bound, &shown, &|_| true) > width {
            shown = optional.iter().map(|optional| !optional).collect();
            if needed(&bound, &shown) > width {
                stacked = true;
                bound = self.bounds(content, true);
            }
            for index in 0..self.columns.len() {
                if optional[index] {
                    shown[index] = true;
                    if width_of(&bound, &shown, &|column| !optional[column]) > width {
                        shown[index] = false;
                    }
                }
            }
        }
        (shown, stacked)
    }
}

/// The width the `shown` columns take at their least widths (`bound`:
/// full and least width of each), gaps included.
fn needed(bound: &[(usize, usize)], shown: &[bool]) -> usize {
    let (sum, count) = bound
        .iter()
        .zip(shown)
        .filter(|(_, shown)| **shown)
        .fold((0usize, 0usize), |(sum, count), ((_, least), _)| {
            (sum + least, count + 1)
        });
    sum + GAP * count.saturating_sub(1)
}

/// The width the `shown` columns take, each at its least width or, where
/// `full_of` says, at its full width, gaps included.
fn width_of(bound: &[(usize, usize)], shown: &[bool], full_of: &dyn Fn(usize) -> bool) -> usize {
    let (sum, count) = (0..shown.len()).filter(|index| shown[*index]).fold(
        (0usize, 0usize),
        |(sum, count), index| {
            let (full, least) = bound[index];
            (sum + if full_of(index) { full } else { least }, count + 1)
        },
    );
    sum + GAP * count.saturating_sub(1)
}

/// Each column's width (`None`: not shown): its least, then what is left of
/// `width` goes to the required columns first, shared out evenly up to their
/// full width, then to the optional ones.
fn share_out(
    bound: &[(usize, usize)],
    shown: &[bool],
    optional: &[bool],
    width: usize,
) -> Vec<Option<usize>> {
    let mut widths: Vec<Option<usize>> = bound
        .iter()
        .zip(shown)
        .map(|((_, least), shown)| shown.then_some(*least))
        .collect();
    let mut spare = width.saturating_sub(needed(bound, shown));
    for pass_optional in [false, true] {
        while spare > 0 {
            let mut grew = false;
            for (index, slot) in widths.iter_mut().enumerate() {
                if optional[index] == pass_optional
                    && let Some(current) = slot
                    && spare > 0
                    && *current < bound[index].0
                {
                    *current += 1;
                    spare -= 1;
                    grew = true;
                }
            }
            if !grew {
                break;
            }
        }
    }
    widths
}

/// The widths of one layout.
struct Layout {
    /// Each column's width; `None`: left out.
    widths: Vec<Option<usize>>,
    /// Headers stacked at underscores.
    stacked: bool,
    /// The widest a line gets.
    total: usize,
}

/// Writes `table` laid out for the current [`width`].
///
/// # Errors
/// When writing to `out` fails.
pub fn write_table(out: &mut dyn Write, table: &Table) -> io::Result<()> {
    for line in table.lines_for(width()) {
        writeln!(out, "{line}")?;
    }
    Ok(())
}

/// A cell's text on one line: control characters as visible escapes, line
/// breaks and tabs as `\n`, `\r`, `\t`.
fn one_line(text: &str) -> String {
    crate::escape::visible(text)
        .replace('\n', "\\n")
        .replace('\t', "\\t")
}

/// Columns a text takes on a terminal (a wide CJK character two), as
/// comfy-table measures it.
fn display_width(text: &str) -> usize {
    unicode_width::UnicodeWidthStr::width(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Asserts what an 80-column terminal needs: no line longer than
    /// `width` characters.
    fn assert_fits(lines: &[String], width: usize) {
        for line in lines {
            // Terminal columns, as the table measures its cells.
            let columns = unicode_width::UnicodeWidthStr::width(line.as_str());
            assert!(
                columns <= width,
                "{columns} > {width}: {line:?}\n{}",
                lines.join("\n")
            );
        }
    }

    fn sample() -> Table {
        // The columns `dead-letters list` prints.
        let mut table = table(crate::commands::dead_letters::LIST_COLUMNS);
        table.add_row([
            "123456",
            "m-50",
            "payments.settlement.dead-letter-queue",
            "exhausted",
            "delivery_limit",
            "payments.settlement",
            "payment.settlement.captured",
            "order-9f86d081884c7d659a2feaa0c55ad015:capture",
            "16777216",
            "2026-12-01T08:00:00.123Z",
        ]);
        table
    }

    #[test]
    fn a_wide_table_fits_80_columns_with_ellipses() {
        let lines = sample().lines_for(Some(80));
        assert_fits(&lines, 80);
        let header: Vec<&str> = lines[0].split_whitespace().collect();
        // Whole header words, optional columns left out.
        assert_eq!(
            header,
            [
                "ID",
                "MESSAGE_ID",
                "SOURCE",
                "REASON_CLASS",
                "EVENT_TYPE",
                "DIED_AT"
            ],
            "{lines:#?}"
        );
        assert_eq!(lines.len(), 2);
        // Ids, times and class names whole; free text cut with an ellipsis.
        for whole in ["123456", "m-50", "exhausted", "2026-12-01T08:00:00.123Z"] {
            assert!(lines[1].contains(whole), "{whole}: {lines:#?}");
        }
        let cells: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(cells[1], "m-50", "{lines:#?}");
        assert!(
            cells[2].starts_with("paym") && cells[2].ends_with(ELLIPSIS),
            "{lines:#?}"
        );
        assert_eq!(lines[1].chars().count(), 80, "{lines:#?}");
    }

    #[test]
    fn wide_shows_every_column_in_full() {
        let lines = sample().lines_for(None);
        for whole in [
            "DEATH_REASON",
            "BODY_SIZE",
            "payments.settlement.dead-letter-queue",
            "order-9f86d081884c7d659a2feaa0c55ad015:capture",
            "16777216",
        ] {
            assert!(lines.join("\n").contains(whole), "{whole}: {lines:#?}");
        }
        assert!(!lines.join("\n").contains(ELLIPSIS));
    }

    #[test]
    fn a_table_that_fits_is_left_as_it_is() {
        let mut small = table(&[Column::keep("verdict"), Column::keep("count")]);
        small.add_row(["replayable", "6"]);
        small.add_row(["needs_compensation", "10"]);
        assert_eq!(
            small.lines_for(Some(80)),
            [
                "VERDICT             COUNT",
                "replayable          6",
                "needs_compensation  10"
            ]
        );
        // A wider terminal shows the optional columns.
        let lines = sample().lines_for(Some(250));
        assert!(lines[0].contains("DEATH_REASON"), "{lines:#?}");
        assert!(!lines.join("\n").contains(ELLIPSIS), "{lines:#?}");
    }

    /// A table of verdict counts: `value` (cut), then `total` and the
    /// first `verdicts` verdicts in precedence order (all kept).
    fn counts_table(verdicts: usize) -> Table {
        let mut columns = vec![Column::shorten("value"), Column::keep("total")];
        columns.extend(
            crate::commands::precheck::VERDICTS[..verdicts]
                .iter()
                .map(|verdict| Column::keep(verdict.name())),
        );
        table(&columns)
    }

    #[test]
    fn headers_stack_at_underscores_rather_than_break() {
        let mut counts = counts_table(6);
        counts.add_row(["orders", "10", "1", "1", "1", "1", "1", "5"]);
        let lines = counts.lines_for(Some(80));
        assert_fits(&lines, 80);
        let text = lines.join("\n");
        for word in ["ALREADY", "REPLAYED", "BLOCKED", "STATE", "REPLAYABLE"] {
            assert!(
                text.split_whitespace().any(|part| part == word),
                "{word}: {text}"
            );
        }
    }

    #[test]
    fn wide_characters_count_two_columns() {
        let mut names = table(&[Column::keep("id"), Column::shorten("source")]);
        names.add_row(["1", "注文キュー-死んだ手紙-再送-注文キュー-死んだ手紙-再送"]);
        let lines = names.lines_for(Some(30));
        assert_fits(&lines, 30);
        assert!(lines[1].ends_with(ELLIPSIS), "{lines:#?}");
    }

    #[test]
    fn a_table_too_wide_at_its_least_is_split_in_parts() {
        let mut counts = counts_table(8);
        counts.add_row([
            "rejected", "80", "10", "10", "10", "10", "10", "10", "10", "10",
        ]);
        let lines = counts.lines_for(Some(80));
        assert_fits(&lines, 80);
        let text = lines.join("\n");
        // Every count is there, each part starts with the row's value.
        for word in ["NEEDS_COMPENSATION", "INVALID", "ALREADY_REPLAYED", "TOTAL"] {
            assert!(
                text.split_whitespace().any(|part| part == word),
                "{word}: {text}"
            );
        }
        let parts: Vec<&str> = text.split("\n\n").collect();
        assert!(parts.len() >= 2, "{text}");
        for part in parts {
            assert!(part.starts_with("VALUE"), "{text}");
            assert!(part.contains("rejected"), "{text}");
        }
    }

    #[test]
    fn cells_are_one_line_without_controls() {
        let mut notes = table(&[Column::keep("id"), Column::shorten("reason")]);
        notes.add_row(["1", "two\nlines\tand \u{1b}[2J"]);
        let lines = notes.lines_for(None);
        assert_eq!(lines.len(), 2);
        assert!(
            lines[1].ends_with("two\\nlines\\tand \\x1b[2J"),
            "{lines:#?}"
        );
    }

    #[test]
    fn the_width_comes_from_the_terminal_then_columns_then_80() {
        assert_eq!(width_for(true, Some(120), Some("100")), None);
        assert_eq!(width_for(false, Some(120), Some("100")), Some(120));
        assert_eq!(width_for(false, None, Some("100")), Some(100));
        assert_eq!(width_for(false, None, Some("wide")), Some(80));
        assert_eq!(width_for(false, Some(0), None), Some(80));
    }
}
