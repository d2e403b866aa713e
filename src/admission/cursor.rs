//! A cursor over a review's text, for the single pass: it walks the
//! envelope, the request, the objects and their statuses member by member
//! and reads each member's value with serde_json, which validates it, or
//! moves past a value nobody reads with the validating skip of
//! [`super::skip`], which validates it as serde_json would.
//!
//! What it adds to serde_json is [`Cursor::same`]: moving past a value by
//! comparing its bytes with a value already read. The API server encodes
//! `object` and `oldObject` with the same encoder, so every value a write did
//! not change is the same bytes in both; the second object's copy of it is
//! then checked with a comparison of bytes (tens of GB/s) instead of a scan
//! (about 2 GB/s), and never read again. And [`Cursor::skip_against`]: a
//! value that a write changed in a few places (a controller's rewrite of
//! its conditions) is read against the first object's where it differs,
//! and only there.

use std::borrow::Cow;
use std::marker::PhantomData;

use serde::de::{DeserializeSeed, IgnoredAny};

use super::skip::ValueStarts;
use super::wire::BorrowedKey;
use crate::value_budget::ValueBudget;

/// The cursor gave up: the text is not what the single pass reads (not
/// JSON, or not a review it handles alone). The two-pass path then reads
/// the body and says what is wrong with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Unread;

impl From<serde_json::Error> for Unread {
    fn from(_: serde_json::Error) -> Self {
        Unread
    }
}

#[cfg(test)]
thread_local! {
    /// How many values this thread's cursors took by their text.
    static TAKEN_BY_TEXT: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// How many values this thread's cursors have taken by their text.
#[cfg(test)]
pub(crate) fn taken_by_text() -> usize {
    TAKEN_BY_TEXT.get()
}

/// Counts values taken by their text, for the tests.
pub(crate) fn count_taken(_values: usize) {
    #[cfg(test)]
    TAKEN_BY_TEXT.set(TAKEN_BY_TEXT.get() + _values);
}

#[cfg(test)]
thread_local! {
    /// How many values this thread's cursors read against another's text.
    static READ_AGAINST: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// How many values this thread's cursors have read against another's
/// text ([`Cursor::skip_against`]), not whole.
#[cfg(test)]
pub(crate) fn read_against() -> usize {
    READ_AGAINST.get()
}

/// Where `part`, a slice of `text`, lies in it: its start and end. `None`
/// for text from elsewhere.
pub(crate) fn span_in(text: &str, part: &str) -> Option<(usize, usize)> {
    let start = (part.as_ptr() as usize).checked_sub(text.as_ptr() as usize)?;
    (start + part.len() <= text.len()).then_some((start, start + part.len()))
}

/// Where the values of the object read first start, noted as it is
/// skipped ([`Cursor::note_starts`]), for [`Cursor::skip_against`].
/// Held within the review's value budget: it stops noting (and those reads
/// read whole) rather than fail the read.
#[derive(Debug, Default)]
struct Starts {
    starts: Vec<u32>,
    noting: bool,
}

impl Starts {
    /// Room for more starts, spent from the review's budget; `false`, and no
    /// more noting, where the budget has not that much left.
    #[cold]
    fn grow(&mut self) -> bool {
        let more = self.starts.capacity().max(1024);
        let bytes = more * std::mem::size_of::<u32>();
        // Asked first: a spend refused would leave the review nothing.
        let affordable = ValueBudget::left().is_none_or(|left| left >= bytes)
            && ValueBudget::spend::<serde_json::Error>(bytes).is_ok();
        if affordable {
            self.starts.reserve_exact(more);
        } else {
            self.noting = false;
        }
        affordable
    }
}

impl ValueStarts for Starts {
    #[inline(always)]
    fn note(&mut self, at: usize) {
        if self.starts.len() == self.starts.capacity() && !self.grow() {
            return;
        }
        if let Ok(at) = u32::try_from(at) {
            self.starts.push(at);
        }
    }

    /// `None` once it has stopped noting: the items of a list are then
    /// read alone, since no item's starts are there to read another against.
    #[inline(always)]
    fn noted(&self) -> Option<&[u32]> {
        self.noting.then_some(self.starts.as_slice())
    }

    fn forget_from(&mut self, kept: usize) {
        self.starts.truncate(kept);
    }
}

/// The members of the object that is the whole of `text`, as the single
/// pass takes an item's: each key, and its value's text (a slice of `text`),
/// in order.
pub(crate) fn members_of(text: &str) -> Result<Vec<(Cow<'_, str>, &str)>, Unread> {
    let mut cursor = Cursor::new(text);
    let mut members = Vec::new();
    cursor.object(|cursor, key| {
        members.push((key, cursor.skip()?));
        Ok(())
    })?;
    cursor.end()?;
    Ok(members)
}

/// A position in JSON text known to be UTF-8.
#[derive(Debug)]
pub(crate) struct Cursor<'b> {
    text: &'b str,
    at: usize,
    starts: Starts,
}

impl<'b> Cursor<'b> {
    pub(crate) fn new(text: &'b str) -> Self {
        Self {
            text,
            at: 0,
            starts: Starts::default(),
        }
    }

    /// From here on (`true`) [`Cursor::skip`] notes where each value it
    /// moves past starts, up to `false`: for the object read first, which
    /// the second is read against. Noted in order of the text, as
    /// [`Cursor::skip_against`] needs them.
    pub(crate) fn note_starts(&mut self, noting: bool) {
        self.starts.noting = noting;
    }

    /// Moves past JSON's white space (the four characters serde_json skips).
    fn skip_space(&mut self) {
        let bytes = self.text.as_bytes();
        while let Some(b' ' | b'\n' | b'\t' | b'\r') = bytes.get(self.at) {
            self.at += 1;
        }
    }

    /// The next byte that is not white space.
    pub(crate) fn peek(&mut self) -> Option<u8> {
        self.skip_space();
        self.text.as_bytes().get(self.at).copied()
    }

    fn eat(&mut self, byte: u8) -> Result<(), Unread> {
        match self.peek() {
            Some(b) if b == byte => {
                self.at += 1;
                Ok(())
            }
            _ => Err(Unread),
        }
    }

    /// Where the value here starts (past white space), for [`Cursor::since`].
    pub(crate) fn start(&mut self) -> usize {
        self.skip_space();
        self.at
    }

    /// The text from `start` to here.
    pub(crate) fn since(&self, start: usize) -> &'b str {
        &self.text[start..self.at]
    }

    /// Reads the value here with `seed` and moves past it: what it read,
    /// and the value's text (without the white space around it).
    pub(crate) fn value<T>(&mut self, seed: impl DeserializeSeed<'b, Value = T>) -> Result<(T, &'b str), Unread> {
        self.skip_space();
        let start = self.at;
        let mut deserializer = serde_json::Deserializer::from_str(&self.text[start..]);
        let read = seed.deserialize(&mut deserializer)?;
        // serde_json's stream starts where the deserializer stopped: right
        // after the value, before anything it only peeked at.
        self.at = start + deserializer.into_iter::<IgnoredAny>().byte_offset();
        Ok((read, &self.text[start..self.at]))
    }

    /// Moves past the value here, validated as serde_json's `IgnoredAny`
    /// validates it (see [`super::skip`]) and built into nothing: its text.
    pub(crate) fn skip(&mut self) -> Result<&'b str, Unread> {
        self.skip_space();
        // Our own validating skip where it is sure, serde_json's where not.
        let end = if self.starts.noting {
            super::skip::value_end_noting(self.text.as_bytes(), self.at, &mut self.starts)
        } else {
            super::skip::value_end(self.text.as_bytes(), self.at)
        };
        match end {
            Some(end) => {
                let text = self.text.get(self.at..end).ok_or(Unread)?;
                self.at = end;
                Ok(text)
            }
            None => self.value(PhantomData::<IgnoredAny>).map(|(_, text)| text),
        }
    }

    /// Moves past the value here as [`Cursor::skip`] does, read against
    /// `first` (if any), the text of a value of this text skipped while
    /// noting ([`Cursor::note_starts`]): only where it differs from `first`
    /// (see [`super::skip::value_end_against`]), else whole.
    pub(crate) fn skip_against(&mut self, first: Option<&str>) -> Result<&'b str, Unread> {
        self.skip_space();
        // Only an object or a list holds values to read alone: a string, a
        // number or a literal that differs is read whole.
        let Some(first) = first.filter(|first| matches!(first.as_bytes().first(), Some(b'{' | b'['))) else {
            return self.skip();
        };
        let end = span_in(self.text, first).and_then(|first| {
            super::skip::value_end_against(self.text.as_bytes(), self.at, first, &self.starts.starts)
        });
        match end.and_then(|end| self.text.get(self.at..end)) {
            Some(text) => {
                self.at += text.len();
                #[cfg(test)]
                READ_AGAINST.set(READ_AGAINST.get() + 1);
                Ok(text)
            }
            None => self.skip(),
        }
    }

    /// Moves past the value here if its text is `text`, the text of a value
    /// read before, and says whether it did.
    ///
    /// Text that is byte for byte a whole JSON value is that value, with one
    /// exception: a number is also the start of a longer one (`12` of
    /// `123`). A value is therefore only taken where what follows it ends a
    /// member or an item, which no number continues into.
    pub(crate) fn same(&mut self, text: &str) -> bool {
        self.skip_space();
        let rest = &self.text.as_bytes()[self.at..];
        !text.is_empty() && rest.starts_with(text.as_bytes()) && self.take_ending(text.len())
    }

    /// How many bytes from here (past white space) are those `text` starts
    /// with.
    pub(crate) fn common_prefix(&mut self, text: &str) -> usize {
        self.skip_space();
        super::skip::common_prefix(&self.text.as_bytes()[self.at..], text.as_bytes())
    }

    /// Moves past the `len` bytes here, known to be the text of a value
    /// read before ([`Cursor::common_prefix`]), if they are the whole value
    /// here (as [`Cursor::same`] tells), and says whether it did.
    pub(crate) fn take_ending(&mut self, len: usize) -> bool {
        let Some(rest) = self.text.as_bytes().get(self.at + len..) else {
            return false;
        };
        let after = rest.iter().find(|b| !matches!(b, b' ' | b'\n' | b'\t' | b'\r'));
        if len > 0 && matches!(after, Some(b',' | b'}' | b']')) {
            self.at += len;
            count_taken(1);
            true
        } else {
            false
        }
    }

    /// Moves to `at` and past the value there, validated as
    /// [`Cursor::skip`] validates it, read against `first` (if any) as
    /// [`Cursor::skip_against`] reads it: its text. `None`, the cursor where
    /// it was, where the text there is not a value.
    pub(crate) fn skip_at(&mut self, at: usize, first: Option<&str>) -> Option<&'b str> {
        let was = self.at;
        self.at = at;
        let skipped = self.skip_against(first).ok();
        if skipped.is_none() {
            self.at = was;
        }
        skipped
    }

    /// The position here, white space not skipped.
    pub(crate) fn here(&self) -> usize {
        self.at
    }

    /// How many starts are noted: [`Cursor::forget_starts_from`] forgets
    /// those noted after.
    pub(crate) fn starts_noted(&self) -> usize {
        self.starts.starts.len()
    }

    /// The starts noted so far.
    #[cfg(test)]
    pub(crate) fn starts(&self) -> &[u32] {
        &self.starts.starts
    }

    /// Forgets the starts noted after the first `kept`.
    pub(crate) fn forget_starts_from(&mut self, kept: usize) {
        self.starts.forget_from(kept);
    }

    /// The text at `to` of `from`, a value of this text read before (while
    /// noting, if noting now) whose bytes are known to be at `to` too, past
    /// every position noted so far: the value at `to`, taken unread, its
    /// starts noted as [`Cursor::note_moved`] notes them. The cursor does
    /// not move.
    pub(crate) fn moved(&mut self, from: &str, to: usize) -> Option<&'b str> {
        let there = self.text_at(to, from.len())?;
        debug_assert_eq!(there, from, "moved only to the same bytes");
        self.note_moved(from, to);
        Some(there)
    }

    /// The `len` bytes of this text at `to`, if they are there.
    pub(crate) fn text_at(&self, to: usize, len: usize) -> Option<&'b str> {
        self.text.get(to..to.checked_add(len)?)
    }

    /// Where noting, notes again the starts noted inside `from` (a slice of
    /// this text read before) moved to `to`, past every position noted so
    /// far, where the same bytes are: as a read of them would note them
    /// (the same bytes hold the same values).
    pub(crate) fn note_moved(&mut self, from: &str, to: usize) {
        let Some((start, end)) = span_in(self.text, from).filter(|_| self.starts.noting) else {
            return;
        };
        // Else what is noted would be read again, or out of order.
        debug_assert!(to >= end, "moved past where it was");
        debug_assert!(self.starts.starts.last().is_none_or(|&last| (last as usize) < to));
        // What is moved was most often read just before: its starts are
        // among the last, found from the end in steps that double.
        let noted = &self.starts.starts;
        let mut back = 8;
        let mut low = noted.len().saturating_sub(back);
        while low > 0 && noted[low] as usize >= start {
            back *= 2;
            low = noted.len().saturating_sub(back);
        }
        let mut first = low + noted[low..].partition_point(|&noted| (noted as usize) < start);
        super::skip::note_moved(&mut self.starts, &mut first, end, (start, to));
    }

    /// Moves past `text` if the text here (white space included) starts
    /// with it, and says whether it did.
    pub(crate) fn take_text(&mut self, text: &str) -> bool {
        let taken = self.text.as_bytes()[self.at..].starts_with(text.as_bytes());
        if taken {
            self.at += text.len();
        }
        taken
    }

    /// A member's key: borrowed from the text where it holds no escape (the
    /// common case, found with one search), else unescaped by serde_json.
    fn key(&mut self) -> Result<Cow<'b, str>, Unread> {
        self.skip_space();
        let start = self.at + 1;
        if self.text.as_bytes().get(self.at) == Some(&b'"') {
            // A string's text is any character but `"`, `\` and the
            // controls (U+0000 to U+001F); the text is UTF-8 already.
            if let Some(end) = super::skip::plain_string_end(self.text.as_bytes(), start)
                && let Some(key) = self.text.get(start..end - 1)
            {
                self.at = end;
                return Ok(Cow::Borrowed(key));
            }
        }
        Ok(self.value(BorrowedKey)?.0)
    }

    /// Walks the object here member by member: `member` is given each key
    /// and must move past its value.
    pub(crate) fn object(
        &mut self,
        member: impl FnMut(&mut Self, Cow<'b, str>) -> Result<(), Unread>,
    ) -> Result<(), Unread> {
        self.eat(b'{')?;
        if self.peek() == Some(b'}') {
            self.at += 1;
            return Ok(());
        }
        self.members(member)
    }

    /// Walks the rest of the object whose first members the caller read:
    /// the cursor is just past the last one's value. `member` is given each
    /// key after it, as [`Cursor::object`] gives them.
    pub(crate) fn rest_of_object(
        &mut self,
        member: impl FnMut(&mut Self, Cow<'b, str>) -> Result<(), Unread>,
    ) -> Result<(), Unread> {
        if self.past_member()? {
            self.members(member)
        } else {
            Ok(())
        }
    }

    /// The members from here (a key) to past the object's `}`.
    fn members(&mut self, mut member: impl FnMut(&mut Self, Cow<'b, str>) -> Result<(), Unread>) -> Result<(), Unread> {
        loop {
            let key = self.key()?;
            self.eat(b':')?;
            member(self, key)?;
            if !self.past_member()? {
                return Ok(());
            }
        }
    }

    /// Past the `,` after a member's value (`true`: a member follows) or
    /// the `}` after the last (`false`).
    fn past_member(&mut self) -> Result<bool, Unread> {
        match self.peek() {
            Some(b',') => {
                self.at += 1;
                Ok(true)
            }
            Some(b'}') => {
                self.at += 1;
                Ok(false)
            }
            _ => Err(Unread),
        }
    }

    /// Walks the list here item by item: `item` is given each index and
    /// must move past the item.
    pub(crate) fn list(&mut self, mut item: impl FnMut(&mut Self, usize) -> Result<(), Unread>) -> Result<(), Unread> {
        self.eat(b'[')?;
        if self.peek() == Some(b']') {
            self.at += 1;
            return Ok(());
        }
        for index in 0.. {
            item(self, index)?;
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b']') => break,
                _ => return Err(Unread),
            }
        }
        self.at += 1;
        Ok(())
    }

    /// Nothing but white space is left.
    pub(crate) fn end(mut self) -> Result<(), Unread> {
        match self.peek() {
            None => Ok(()),
            Some(_) => Err(Unread),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn members(text: &str) -> Result<Vec<(String, String)>, Unread> {
        let read = members_of(text)?;
        Ok(read.into_iter().map(|(k, v)| (k.into_owned(), v.to_owned())).collect())
    }

    #[test]
    fn an_object_is_walked_as_serde_json_reads_it() {
        let text = " { \"a\" : [1, {\"b\": \"}\"}] ,\"c\\u0041\":-1.5e3, \"d\":{} } ";
        assert_eq!(
            members(text).unwrap(),
            vec![
                ("a".to_owned(), r#"[1, {"b": "}"}]"#.to_owned()),
                ("cA".to_owned(), "-1.5e3".to_owned()),
                ("d".to_owned(), "{}".to_owned()),
            ]
        );
        assert_eq!(members("{}").unwrap(), vec![]);
        assert!(members("[1]").is_err(), "a list is not an object");
        let keys = members(r#"{"é\"q":1,"\u00e9":2,"ü":3}"#).unwrap();
        let keys: Vec<&str> = keys.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["é\"q", "é", "ü"]);
        for bad in [
            "{",
            "{\"a\"}",
            "{\"a\":1,}",
            "{\"a\":1 \"b\":2}",
            "{\"a\":1}x",
            "{\"a\":01}",
            "{1:2}",
            "{\"a\":tru}",
            "{\"a\tb\":1}",
            "{\"a\\x\":1}",
        ] {
            assert!(members(bad).is_err(), "{bad}");
            assert!(serde_json::from_str::<Value>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_list_is_walked_item_by_item() {
        let mut cursor = Cursor::new("[ 1 , \"x\", [2] ]");
        let mut items = Vec::new();
        cursor
            .list(|cursor, index| {
                items.push((index, cursor.skip()?));
                Ok(())
            })
            .unwrap();
        assert_eq!(items, vec![(0, "1"), (1, "\"x\""), (2, "[2]")]);
        for bad in ["[1,]", "[1 2]", "[", "{}"] {
            assert!(Cursor::new(bad).list(|c, _| c.skip().map(|_| ())).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_same_text_is_taken_only_where_it_is_the_whole_value() {
        for (text, read, same) in [
            (r#"{"a":"x"},"#, "{\"a\":\"x\"}", true),
            (r#"{"a":"x"}"#, "{\"a\":\"x\"}", false),
            ("12,", "12", true),
            ("12 ,", "12", true),
            ("123,", "12", false),
            ("12.5,", "12", false),
            ("12e1,", "12", false),
            ("12]", "12", true),
            ("true}", "true", true),
            ("[1,2]", "[1,2]", false),
            ("", "", false),
            ("1,", "", false),
        ] {
            let mut cursor = Cursor::new(text);
            assert_eq!(cursor.same(read), same, "{text:?} {read:?}");
            assert_eq!(cursor.at, if same { read.len() } else { 0 });
        }
    }
}
