//! Moving past a JSON value nobody reads, validated, at fewer cycles per
//! token than serde_json.
//!
//! The single pass validates every byte of the first object once (the
//! second is compared with it by bytes, and so is an item alike to the item
//! before it in a list the rules read item by item), and most of those bytes belong to
//! values it only skips: a status's unowned lists (a Widget's 120
//! `endpoints`), `spec`, the owned values taken whole as text, the members
//! of each condition.
//! On an endpoint entry such as
//! `{"ip":"10.1.0.0","port":8080,"ready":true,"zone":"a"}`, serde_json's
//! `IgnoredAny` costs per token, not per byte: each goes through its
//! visitor and error machinery. [`value_end`] is a loop over the bytes with no
//! visitor, no error values and no allocation (eight bytes at a time inside
//! a string). With it, and the smaller changes measured beside it, the
//! fixture's denial is decided in 13–16 % less time in process
//! (BENCHMARKS.md, "a validating skip of our own").
//!
//! It is sound, not complete: where it answers, serde_json's `IgnoredAny`
//! reads the same text to the same end; where it is unsure (a value nested
//! deeper than [`MAX_DEPTH`] in one read) or the text is not valid, it
//! answers `None`, and the caller reads the value with serde_json, whose
//! answer (and error) stands. A property test compares the two on
//! arbitrary text.

/// The deepest nesting one read follows (its stack of open containers is
/// one 64-bit word); deeper values are left to serde_json, whose skip has no
/// depth limit of its own. A list read item by item ([`value_end_noting`])
/// reads each item in a read of its own, so it may answer for a list whose
/// items nest deeper than this: serde_json ends it at the same place.
const MAX_DEPTH: u32 = 64;

/// Bytes that end a string's plain run: `"`, `\` and the control
/// characters JSON forbids in a string (U+0000 to U+001F). Only the last
/// few bytes of a text are looked up here, yet a `matches!` in its place
/// made the whole skip slower (the route's denial 62.8 -> 68.8 µs in
/// process, from how the loops around it were compiled): measured, kept.
const fn string_specials() -> [bool; 256] {
    let mut table = [false; 256];
    let mut byte = 0;
    while byte < 0x20 {
        table[byte] = true;
        byte += 1;
    }
    table[b'"' as usize] = true;
    table[b'\\' as usize] = true;
    table
}

static STRING_SPECIAL: [bool; 256] = string_specials();

/// Where a validating skip notes the start of each value it meets.
pub(crate) trait ValueStarts {
    /// Whether it notes anything: a read against noted starts that notes
    /// nothing leaves out the work of moving them.
    const NOTES: bool = true;

    fn note(&mut self, at: usize);

    /// Every start noted so far, in order, where they are kept: a list's
    /// items are then read against the item before them
    /// ([`value_end_noting`]). `None` where nothing is kept.
    fn noted(&self) -> Option<&[u32]> {
        None
    }

    /// Forgets the starts noted after the first `kept`.
    fn forget_from(&mut self, _kept: usize) {}
}

/// Starts noted before, read and never added to: the object read first,
/// as the second is read against it.
struct NotedBefore<'s>(&'s [u32]);

impl ValueStarts for NotedBefore<'_> {
    const NOTES: bool = false;

    #[inline(always)]
    fn note(&mut self, _: usize) {}

    #[inline(always)]
    fn noted(&self) -> Option<&[u32]> {
        Some(self.0)
    }
}

/// Notes nothing: every skip but those of the object read first.
struct Unnoted;

impl ValueStarts for Unnoted {
    const NOTES: bool = false;

    #[inline(always)]
    fn note(&mut self, _: usize) {}
}

/// The end of the JSON value that starts at `at` (white space before it
/// allowed), if serde_json's `IgnoredAny` reads the same text to the same
/// end; `None` if the text is not a valid value there, or if it is not sure.
pub(crate) fn value_end(text: &[u8], at: usize) -> Option<usize> {
    value_end_noting(text, at, &mut Unnoted)
}

/// [`value_end`], noting in `starts` where each string, number and literal
/// it meets starts (the value itself, its members' values, its items, and
/// theirs, in order), for a later read of another text against this one
/// ([`value_end_against`]): only those are ever read alone.
/// What it notes before it answers `None` are starts too: the text up to
/// there is JSON.
///
/// A list is read item by item, each item after the first against the
/// item before it, where `starts` keeps what it notes: the items of a
/// status's long lists (endpoints, addresses, per-shard states) have the
/// same members, and differ in a few values each. An endpoint entry such as
/// `{"ip":"10.1.0.7","port":8080,"ready":true,"zone":"a"}` is then two
/// comparisons of bytes and one string read, not thirteen tokens: an 844 KB
/// review whose owned list of such entries did not change is denied in
/// 64-70 % of the time (`cargo bench --bench decision -- "endpoints
/// owned"`; BENCHMARKS.md, "items read against the item before"). The
/// starts of an item read so are noted as a read of it alone would note
/// them, so that the object read second is read against the first just as
/// well.
pub(crate) fn value_end_noting(text: &[u8], at: usize, starts: &mut impl ValueStarts) -> Option<usize> {
    let at = past_space(text, at);
    if text.get(at) == Some(&b'[') && starts.noted().is_some() {
        return list_end_noting(text, at, starts);
    }
    nested_end(text, at, starts)
}

/// The end of the list at `at` (its `[`), each item after the first read
/// against the item before it ([`value_end_against_noting`]) where that item
/// is an object or a list, else, and wherever that read cannot tell, read
/// alone.
fn list_end_noting(text: &[u8], at: usize, starts: &mut impl ValueStarts) -> Option<usize> {
    let mut item = past_space(text, at + 1);
    if text.get(item) == Some(&b']') {
        return Some(item + 1);
    }
    let mut before: Option<ReadBefore> = None;
    // Items of other shapes are each tried, and read alone where they first
    // differ: more work than reading them alone (10-15 % in a rough timing
    // loop, BENCHMARKS.md). Giving up after a failed try made the alike
    // items slower in the same loop, so every item is tried.
    loop {
        let kept = starts.noted().map(<[u32]>::len);
        let against = before
            .filter(|before| matches!(text.get(before.start), Some(b'{' | b'[')))
            .zip(kept)
            .and_then(|(before, kept)| {
                let end = value_end_against_noting(text, item, before, starts);
                if end.is_none() {
                    starts.forget_from(kept);
                }
                end
            });
        let end = match against {
            Some(end) => {
                #[cfg(test)]
                ITEMS_READ_AGAINST.set(ITEMS_READ_AGAINST.get() + 1);
                end
            }
            None => nested_end(text, item, starts)?,
        };
        before = Some(ReadBefore {
            start: item,
            end,
            noted: kept.unwrap_or(0),
        });
        let after = past_space(text, end);
        match *text.get(after)? {
            b',' => item = past_space(text, after + 1),
            b']' => return Some(after + 1),
            _ => return None,
        }
    }
}

#[cfg(test)]
thread_local! {
    /// How many items of a list were read against the item before them.
    static ITEMS_READ_AGAINST: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// A value read before the one read against it: its span in the text, and
/// the index among the noted starts of its first start (or of the first
/// start after it, if it has none).
#[derive(Debug, Clone, Copy)]
struct ReadBefore {
    start: usize,
    end: usize,
    noted: usize,
}

/// [`value_end_noting`] without reading a list's items against each other.
#[inline(always)]
fn nested_end(text: &[u8], mut at: usize, starts: &mut impl ValueStarts) -> Option<usize> {
    // One bit per open container, the innermost lowest: 1 for an object.
    let mut objects: u64 = 0;
    let mut depth = 0u32;
    loop {
        at = past_space(text, at);
        match *text.get(at)? {
            b'"' => {
                starts.note(at);
                at = string_end(text, at + 1)?;
            }
            open @ (b'{' | b'[') => {
                if depth == MAX_DEPTH {
                    return None;
                }
                let close = if open == b'{' { b'}' } else { b']' };
                let inside = past_space(text, at + 1);
                if text.get(inside) == Some(&close) {
                    at = inside + 1;
                } else {
                    objects = objects << 1 | u64::from(open == b'{');
                    depth += 1;
                    at = if open == b'{' { past_key(text, inside)? } else { inside };
                    continue;
                }
            }
            b't' => {
                starts.note(at);
                at = literal_end(text, at, b"true")?;
            }
            b'f' => {
                starts.note(at);
                at = literal_end(text, at, b"false")?;
            }
            b'n' => {
                starts.note(at);
                at = literal_end(text, at, b"null")?;
            }
            b'-' | b'0'..=b'9' => {
                starts.note(at);
                at = number_end(text, at)?;
            }
            _ => return None,
        }
        // After a value: close the containers that end here, then on to
        // the next value.
        loop {
            if depth == 0 {
                return Some(at);
            }
            at = past_space(text, at);
            let in_object = objects & 1 == 1;
            match (*text.get(at)?, in_object) {
                (b',', true) => {
                    at = past_key(text, at + 1)?;
                    break;
                }
                (b',', false) => {
                    at += 1;
                    break;
                }
                (b'}', true) | (b']', false) => {
                    at += 1;
                    objects >>= 1;
                    depth -= 1;
                }
                _ => return None,
            }
        }
    }
}

/// The end of the JSON value at `at` (white space before it allowed), read
/// against `first`: the span in `text` of a value read before with
/// [`value_end_noting`] (not empty, no white space around it), which noted
/// where its values start (`starts`, sorted; any of them, or none, is
/// sound). The end is the one serde_json's `IgnoredAny` reads the value to
/// ([`value_end`]'s, where it answers: a value read alone is nested within
/// [`MAX_DEPTH`] of its own start, not of `at`), found without reading
/// again the bytes that are `first`'s.
///
/// The bytes alike from here and from `first`'s start are moved past
/// unread. Where they first differ, inside a value whose start was noted (a
/// string, a number or a literal), or just past its end, that value is
/// read here alone with [`value_end`]: up to its start the two
/// texts are the same bytes, so a reader is in the same state in both, and
/// past it in the state it was past the first's. Then on from past both,
/// to the next difference. Where `first`'s end is reached with the byte
/// after it here ending a member or an item (so that no number goes on),
/// the value ends there.
///
/// `None` where it cannot tell: a difference in a key, between values, in an
/// object's or a list's own bytes, in a value whose start was not noted, or
/// just past the value just read. The caller then reads the value whole; the rewrite of
/// a controller's own values (a condition's `observedGeneration` and
/// `lastTransitionTime` in each of 256 conditions of a Gateway API route)
/// is the case it is for.
pub(crate) fn value_end_against(text: &[u8], at: usize, first: (usize, usize), starts: &[u32]) -> Option<usize> {
    let (start, end) = first;
    let noted = starts.partition_point(|&noted| (noted as usize) < start);
    value_end_against_noting(text, at, ReadBefore { start, end, noted }, &mut NotedBefore(starts))
}

/// [`value_end_against`], `first`'s starts those `starts` noted before it,
/// noting in `starts` where the values of the value read here start, as
/// [`value_end_noting`] would note them: `first`'s, moved to their place
/// here, where the two are the same bytes, and the start of each value
/// read alone. Where it answers `None`, what it noted is no use.
#[inline(always)]
fn value_end_against_noting<S: ValueStarts>(
    text: &[u8],
    at: usize,
    first: ReadBefore,
    starts: &mut S,
) -> Option<usize> {
    let ReadBefore {
        start: first_start,
        end: first_end,
        noted: first_noted,
    } = first;
    let first_text = text.get(..first_end)?;
    let (mut here, mut there) = (past_space(text, at), first_start);
    // Where the last value read here ended (before the white space after it).
    let mut value_here_ends = here;
    // The first noted start at or after `there`, walked forward as it moves.
    let mut noted = first_noted;
    // The first of `first`'s starts not yet noted here.
    let mut moved = noted;
    loop {
        let alike = common_prefix(text.get(here..)?, first_text.get(there..)?);
        if there + alike == first_end {
            let end = if alike == 0 { value_here_ends } else { here + alike };
            let after = text.get(past_space(text, end)).copied();
            if !matches!(after, Some(b',' | b'}' | b']')) {
                return None;
            }
            note_moved(starts, &mut moved, first_end, (there, here));
            return Some(end);
        }
        let differs = there + alike;
        let first_starts = starts.noted()?;
        // The last noted start at or before the difference.
        while first_starts
            .get(noted + 1)
            .is_some_and(|&start| start as usize <= differs)
        {
            noted += 1;
        }
        let value = *first_starts.get(noted)? as usize;
        // Before `there`: the value just read (or none), which would be
        // read again.
        if value < there || value > differs {
            return None;
        }
        let value_there_ends = any_value_end(first_text, value)?;
        if differs > value_there_ends {
            return None;
        }
        // `first`'s starts before the value, then those of the value read
        // here: its own, or those in it where it is an object or a list
        // (`first`'s is a string, a number or a literal: only those are
        // noted, and none starts inside one).
        note_moved(starts, &mut moved, value, (there, here));
        let value_here = past_space(text, here + (value - there));
        value_here_ends = match text.get(value_here)? {
            b'{' | b'[' => nested_end(text, value_here, starts)?,
            _ => {
                let end = any_value_end(text, value_here)?;
                starts.note(value_here);
                end
            }
        };
        moved = noted + 1;
        // Past both values and the white space after them: a reader is in
        // the same state after either.
        here = past_space(text, value_here_ends);
        there = past_space(first_text, value_there_ends);
    }
}

/// Notes `first`'s starts from the `moved`-th on, up to `before`, where the
/// same bytes are here: `first`'s byte at `there` is the one `here`. Only
/// the starts noted before it began are walked: what it notes lies past
/// them where `here` is past `there`, and the loop ends whatever it is
/// given.
#[inline(always)]
pub(crate) fn note_moved<S: ValueStarts>(
    starts: &mut S,
    moved: &mut usize,
    before: usize,
    (there, here): (usize, usize),
) {
    if !S::NOTES {
        return;
    }
    let past = starts.noted().map_or(0, <[u32]>::len);
    while let Some(start) = starts
        .noted()
        .and_then(|noted| noted.get(*moved))
        .map(|&start| start as usize)
        && *moved < past
        && start < before
    {
        if let Some(by) = start.checked_sub(there) {
            starts.note(here + by);
        }
        *moved += 1;
    }
}

/// [`value_end`], a string, a number or a literal read without its loop
/// (what [`value_end_against`] reads alone is mostly those).
#[inline(always)]
fn any_value_end(text: &[u8], at: usize) -> Option<usize> {
    let at = past_space(text, at);
    match *text.get(at)? {
        b'"' => string_end(text, at + 1),
        b't' => literal_end(text, at, b"true"),
        b'f' => literal_end(text, at, b"false"),
        b'n' => literal_end(text, at, b"null"),
        b'-' | b'0'..=b'9' => number_end(text, at),
        _ => value_end(text, at),
    }
}

/// How many bytes `a` and `b` start with alike: sixteen at a time, the
/// last few in one compare that overlaps bytes known alike (what is
/// compared are values of a status, tens to hundreds of bytes).
pub(crate) fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    let len = a.len().min(b.len());
    let mut at = 0;
    while let (Some(x), Some(y)) = (a.get(at..at + 16), b.get(at..at + 16)) {
        let mut words = [[0; 16]; 2];
        words[0].copy_from_slice(x);
        words[1].copy_from_slice(y);
        let differ = u128::from_le_bytes(words[0]) ^ u128::from_le_bytes(words[1]);
        if differ != 0 {
            return at + differ.trailing_zeros() as usize / 8;
        }
        at += 16;
    }
    // The last few bytes: the last 16 (or 8) compared again, overlapping
    // bytes known alike, rather than one at a time.
    if let (Some(x), Some(y)) = (a.get(len.wrapping_sub(16)..len), b.get(len.wrapping_sub(16)..len)) {
        let mut words = [[0; 16]; 2];
        words[0].copy_from_slice(x);
        words[1].copy_from_slice(y);
        let differ = u128::from_le_bytes(words[0]) ^ u128::from_le_bytes(words[1]);
        return len - 16
            + if differ == 0 {
                16
            } else {
                differ.trailing_zeros() as usize / 8
            };
    }
    if let (Some(x), Some(y)) = (a.get(len.wrapping_sub(8)..len), b.get(len.wrapping_sub(8)..len)) {
        let mut words = [[0; 8]; 2];
        words[0].copy_from_slice(x);
        words[1].copy_from_slice(y);
        let differ = u64::from_le_bytes(words[0]) ^ u64::from_le_bytes(words[1]);
        // Below 16 bytes in all: none compared yet, so the first 8 first.
        let mut head = [[0; 8]; 2];
        head[0].copy_from_slice(&a[..8]);
        head[1].copy_from_slice(&b[..8]);
        let head = u64::from_le_bytes(head[0]) ^ u64::from_le_bytes(head[1]);
        if head != 0 {
            return head.trailing_zeros() as usize / 8;
        }
        return len - 8
            + if differ == 0 {
                8
            } else {
                differ.trailing_zeros() as usize / 8
            };
    }
    while at < len && a[at] == b[at] {
        at += 1;
    }
    at
}

/// Past JSON's white space (the four characters serde_json skips).
#[inline(always)]
fn past_space(text: &[u8], mut at: usize) -> usize {
    while let Some(b' ' | b'\n' | b'\t' | b'\r') = text.get(at) {
        at += 1;
    }
    at
}

/// Past a member's key and its colon, from before the key (white space
/// allowed).
#[inline(always)]
fn past_key(text: &[u8], at: usize) -> Option<usize> {
    let at = past_space(text, at);
    if text.get(at) != Some(&b'"') {
        return None;
    }
    let at = past_space(text, string_end(text, at + 1)?);
    (text.get(at) == Some(&b':')).then_some(at + 1)
}

/// Past a string whose opening quote is just before `at`: its escapes
/// checked as serde_json checks them (`\u` takes any four hex digits; a
/// lone surrogate is refused only by a parse that builds the string).
#[inline(always)]
fn string_end(text: &[u8], mut at: usize) -> Option<usize> {
    loop {
        at = plain_run_end(text, at)?;
        match text[at] {
            b'"' => return Some(at + 1),
            b'\\' => match *text.get(at + 1)? {
                b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => at += 2,
                b'u' if text.get(at + 2..at + 6)?.iter().all(u8::is_ascii_hexdigit) => at += 6,
                _ => return None,
            },
            // A control character.
            _ => return None,
        }
    }
}

/// Where the string whose opening quote is just before `at` ends (past
/// its closing quote) if it holds no escape: its text is then
/// `text[at..end - 1]` as it is. `None` for a string with an escape or a
/// control character, or no end.
#[inline(always)]
pub(crate) fn plain_string_end(text: &[u8], at: usize) -> Option<usize> {
    let end = plain_run_end(text, at)?;
    (text[end] == b'"').then_some(end + 1)
}

/// The first byte from `at` on that ends a string's plain run (a quote, a
/// backslash or a control character), if there is one.
#[inline(always)]
fn plain_run_end(text: &[u8], mut at: usize) -> Option<usize> {
    const ONES: u64 = u64::MAX / 255;
    const HIGH: u64 = ONES << 7;
    // Eight bytes at a time while none ends the run. The lowest flagged
    // byte is exact: a false alarm only comes from a borrow out of a lower
    // byte that matched, so it is answered without a second look. The byte
    // loop below reads only the last few bytes of the text.
    while let Some(eight) = text.get(at..at + 8) {
        let mut word = [0; 8];
        word.copy_from_slice(eight);
        let word = u64::from_le_bytes(word);
        let control = word.wrapping_sub(ONES * 0x20) & !word;
        let quote = word ^ (ONES * u64::from(b'"'));
        let quote = quote.wrapping_sub(ONES) & !quote;
        let backslash = word ^ (ONES * u64::from(b'\\'));
        let backslash = backslash.wrapping_sub(ONES) & !backslash;
        let flagged = (control | quote | backslash) & HIGH;
        if flagged != 0 {
            return Some(at + flagged.trailing_zeros() as usize / 8);
        }
        at += 8;
    }
    while !STRING_SPECIAL[usize::from(*text.get(at)?)] {
        at += 1;
    }
    Some(at)
}

#[inline(always)]
fn past_digits(text: &[u8], mut at: usize) -> usize {
    while let Some(b'0'..=b'9') = text.get(at) {
        at += 1;
    }
    at
}

/// Past a number, as serde_json's grammar has it: `-`?, then `0` or a
/// digit run not starting with `0`, then `.` and digits, then `e` or `E`,
/// a sign and digits.
#[inline(always)]
fn number_end(text: &[u8], mut at: usize) -> Option<usize> {
    if text.get(at) == Some(&b'-') {
        at += 1;
    }
    match *text.get(at)? {
        // One leading zero only: `01` is refused, as serde_json refuses it.
        b'0' if matches!(text.get(at + 1), Some(b'0'..=b'9')) => return None,
        b'0' => at += 1,
        b'1'..=b'9' => at = past_digits(text, at + 1),
        _ => return None,
    }
    if text.get(at) == Some(&b'.') {
        let end = past_digits(text, at + 1);
        if end == at + 1 {
            return None;
        }
        at = end;
    }
    if let Some(b'e' | b'E') = text.get(at) {
        at += 1;
        if let Some(b'+' | b'-') = text.get(at) {
            at += 1;
        }
        let end = past_digits(text, at);
        if end == at {
            return None;
        }
        at = end;
    }
    Some(at)
}

#[inline(always)]
fn literal_end(text: &[u8], at: usize, word: &[u8]) -> Option<usize> {
    (text.get(at..at + word.len())? == word).then_some(at + word.len())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde::Deserialize;
    use serde::de::IgnoredAny;

    use super::*;

    /// What serde_json's `IgnoredAny` reads from the start of `text`: the
    /// end of the value, or `None` where it refuses it.
    fn serde_end(text: &str) -> Option<usize> {
        let mut deserializer = serde_json::Deserializer::from_str(text);
        IgnoredAny::deserialize(&mut deserializer).ok()?;
        Some(deserializer.into_iter::<IgnoredAny>().byte_offset())
    }

    #[test]
    fn values_end_where_serde_json_ends_them() {
        for text in [
            r#"{"ip":"10.1.0.0","port":8080,"ready":true,"zone":"a"},"#,
            " [ 1 , -0.5e+3, 0, 10E2, \"\\u00e9\\n\\\"\", {}, [], null, false ] ]",
            r#"{"a":{"b":[{"c":"}"}]},"d":"\\"} x"#,
            "\"é ü \u{7f}\"tail",
            "0,",
            "-0]",
            "123",
            "\"\"",
        ] {
            let expected = serde_end(text);
            assert!(expected.is_some(), "{text}");
            assert_eq!(value_end(text.as_bytes(), 0), expected, "{text}");
        }
    }

    #[test]
    fn invalid_values_are_left_to_serde_json() {
        for text in [
            "",
            " ",
            "01",
            "-",
            "-a",
            "1.",
            "1.e3",
            "1e",
            "1e+",
            ".5",
            "+1",
            "tru",
            "nul",
            "True",
            "\"a",
            "\"\\x\"",
            "\"\\u12g4\"",
            "\"a\u{1}b\"",
            "\"tab\there\"",
            "{",
            "{\"a\"}",
            "{\"a\":}",
            "{\"a\":1,}",
            "{,}",
            "[1,]",
            "[1 2]",
            "{\"a\":1 \"b\":2}",
            "{1:2}",
            "[}",
            "{]",
            "]",
            "}",
        ] {
            assert_eq!(value_end(text.as_bytes(), 0), None, "{text:?}");
            assert_eq!(serde_end(text), None, "{text:?}");
        }
    }

    #[test]
    fn deep_values_are_left_to_serde_json() {
        let deep = format!("{}{}", "[".repeat(65), "]".repeat(65));
        assert_eq!(value_end(deep.as_bytes(), 0), None);
        assert_eq!(serde_end(&deep), Some(deep.len()));
        let at_limit = format!("{}{}", "[".repeat(64), "]".repeat(64));
        assert_eq!(value_end(at_limit.as_bytes(), 0), Some(at_limit.len()));
    }

    /// Starts noted into a vector, as the cursor notes them.
    impl ValueStarts for Vec<u32> {
        fn note(&mut self, at: usize) {
            self.push(u32::try_from(at).unwrap());
        }

        fn noted(&self) -> Option<&[u32]> {
            Some(self)
        }

        fn forget_from(&mut self, kept: usize) {
            self.truncate(kept);
        }
    }

    /// `second` read against `first` in the text `[first,second]`, the
    /// starts noted as the first was read (those `keep` keeps of them):
    /// where it ends, and where [`value_end`] ends it.
    fn against(first: &str, second: &str, keep: impl Fn(usize) -> bool) -> (Option<usize>, Option<usize>) {
        let text = format!("[{first},{second}]");
        let mut starts = Vec::new();
        assert_eq!(
            value_end_noting(text.as_bytes(), 1, &mut starts),
            Some(1 + first.len()),
            "{first}"
        );
        let starts: Vec<u32> = starts
            .into_iter()
            .enumerate()
            .filter(|(i, _)| keep(*i))
            .map(|(_, s)| s)
            .collect();
        let at = first.len() + 2;
        (
            value_end_against(text.as_bytes(), at, (1, 1 + first.len()), &starts),
            value_end(text.as_bytes(), at),
        )
    }

    #[test]
    fn a_value_is_read_against_the_first_where_it_differs() {
        let condition = |generation: u8, time: &str| {
            format!(
                r#"{{"type":"Ready","status":"True","observedGeneration":{generation},"lastTransitionTime":"{time}","message":"m"}}"#
            )
        };
        let conditions =
            |generation, time| format!("[{},{}]", condition(generation, time), condition(generation, time));
        let first = conditions(3, "2026-12-01T10:06:00Z");
        // Where it ends it, `value_end` ends it.
        for second in [
            first.clone(),
            // Two values of each item, as a controller rewrites them.
            conditions(2, "2026-12-01T10:05:00Z"),
            // A value longer, shorter, or of another kind; white space.
            first.replace(":3,", ":12345,"),
            first.replace(r#""m""#, r#""""#),
            first.replace(r#""m""#, r#"{"a":[1,{"b":null}]}"#),
            first.replace(":3,", ": 3 ,"),
            first.replacen("True", "Tr\\u00fce", 1),
            // A value changed at the very end, white space after it.
            first.replace("\"m\"}]", "\"n\" }]"),
        ] {
            let (read, whole) = against(&first, &second, |_| true);
            assert!(read.is_some(), "{second}");
            assert_eq!(read, whole, "{second}");
        }
        // Where it cannot tell: a key renamed, an item or a member more or
        // fewer, a number longer at the end, a start not noted. Or the text
        // is not JSON: then neither reads it.
        for (first, second, keep) in [
            (first.as_str(), first.replace("\"message\"", "\"massage\""), usize::MAX),
            (first.as_str(), format!("{},1]", &first[..first.len() - 1]), usize::MAX),
            (first.as_str(), first.replacen(r#","message":"m""#, "", 1), usize::MAX),
            ("12", "123".to_owned(), usize::MAX),
            ("[1,2]", "[1,23,4]".to_owned(), usize::MAX),
            (first.as_str(), conditions(2, "2026-12-01T10:06:00Z"), 2),
            (first.as_str(), first.replace(":3,", ":03,"), usize::MAX),
            (first.as_str(), first.replace(":3,", ":3 x,"), usize::MAX),
            (first.as_str(), first.replace("\"m\"}]", "\"m\" } ]"), usize::MAX),
            (first.as_str(), first.replacen(r#""m""#, "\"\u{1}\"", 1), usize::MAX),
        ] {
            let (read, _) = against(first, &second, |i| i < keep);
            assert_eq!(read, None, "{second}");
        }
    }

    /// Where a read ends, and the starts it noted.
    type NotedRead = (Option<usize>, Vec<u32>);

    /// What a read of `text` from its start notes, and where it ends:
    /// with a list's items read against each other (the noting read's), and
    /// each read alone (as [`value_end`] reads, with notes).
    fn noted_both_ways(text: &str) -> (NotedRead, NotedRead) {
        let mut against = Vec::new();
        let end = value_end_noting(text.as_bytes(), 0, &mut against);
        let mut alone = Vec::new();
        let alone_end = nested_end(text.as_bytes(), 0, &mut alone);
        ((end, against), (alone_end, alone))
    }

    #[test]
    fn a_lists_items_are_read_against_the_item_before_and_noted_as_read_alone() {
        let entry = |i: usize| {
            format!(
                r#"{{"ip":"10.1.{}.{}","port":8080,"ready":true,"zone":"a"}}"#,
                i / 250,
                i % 250
            )
        };
        let entries = |n: usize| (0..n).map(entry).collect::<Vec<_>>().join(",");
        ITEMS_READ_AGAINST.set(0);
        let text = format!("[{}]", entries(120));
        let ((end, against), (_, alone)) = noted_both_ways(&text);
        assert_eq!(end, Some(text.len()));
        assert_eq!(against, alone);
        assert_eq!(
            ITEMS_READ_AGAINST.get(),
            119,
            "every entry after the first is read against the one before"
        );
        for text in [
            format!("[ {} ] ,", entries(300).replace(',', " , ")),
            // White space before a value that differs; an item of another
            // shape after a try that noted what is not a start.
            r#"[{"a":1},{"a": 2},{"a" :3 }]"#.to_owned(),
            "[[1,null],[],[1,null]]".to_owned(),
            // Items that differ in kind, in keys, in length, or not at all.
            r#"[{"a":1},{"b":1},{"a":[1,2]},{"a":[1,2,3]},{"a":"x"},{"a":{"b":null}},{"a":1},[1],[1],"s",2,{}]"#
                .to_owned(),
            r#"[{"a":"x","b":1},{"a":"xyz","b":12},{"a":"","b":-1.5e3},{"a":"\n","b":true}]"#.to_owned(),
            "[[1,2],[1,2],[3,4],[[5]],[]]".to_owned(),
        ] {
            let ((end, against), (alone_end, alone)) = noted_both_ways(&text);
            assert_eq!(end, serde_end(&text), "{text}");
            assert_eq!(end, alone_end, "{text}");
            assert!(end.is_some(), "{text}");
            assert_eq!(against, alone, "{text}");
        }
        // Items each nested as deep as one read follows: the list is
        // deeper, and read to serde_json's end.
        let deep = format!("{}1{}", "[".repeat(64), "]".repeat(64));
        let text = format!("[{deep},{}]", deep.replace('1', "2"));
        assert_eq!(value_end_noting(text.as_bytes(), 0, &mut Vec::new()), Some(text.len()));
        assert_eq!(serde_end(&text), Some(text.len()));
        // Not JSON, in the first item or in one read against another.
        for text in [
            r#"[{"a":1},{"a":01}]"#,
            r#"[{"a":1},{"a":1,}]"#,
            r#"[{"a":"x"},{"a":"x\q"}]"#,
            r#"[{"a":1},{"a":1}"#,
            r#"[{"a":1},{"a":1} {"a":1}]"#,
            r#"[{"a":1},{"a":1},]"#,
            r#"[{"a":1}{"a":1}]"#,
        ] {
            assert_eq!(value_end_noting(text.as_bytes(), 0, &mut Vec::new()), None, "{text}");
            assert_eq!(serde_end(text), None, "{text}");
        }
    }

    /// Text near JSON: pieces of its grammar, broken ones included.
    fn json_like() -> impl Strategy<Value = String> {
        let piece = prop::sample::select(vec![
            "{", "}", "[", "]", ",", ":", " ", "\n", "\"", "\\", "\\u00e9", "\\u12", "\\n", "a", "é", "\u{1}", "0",
            "1", "-", ".", "e", "+", "true", "fals", "null", "\"k\":", "\"v\"", "12.5e-3", "0x", "\"\\\"\"",
        ]);
        prop::collection::vec(piece, 0..40).prop_map(|pieces| pieces.concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]

        /// Wherever it answers, serde_json reads the value to the same end.
        #[test]
        fn it_answers_only_as_serde_json_does(text in json_like()) {
            prop_assert_eq!(any_value_end(text.as_bytes(), 0), value_end(text.as_bytes(), 0));
            if let Some(end) = value_end(text.as_bytes(), 0) {
                prop_assert_eq!(serde_end(&text), Some(end));
            }
        }

        /// A string's plain run ends at the first quote, backslash or
        /// control character, whatever follows it in its word of eight.
        #[test]
        fn a_plain_run_ends_at_the_first_special_byte(
            text in prop::collection::vec(prop::sample::select(vec![0u8, 0x1f, 0x20, 0x21, b'"', b'#', b'\\', b']', 0x7f, 0x80, 0xff, b'a']), 0..40),
            at in 0usize..40,
        ) {
            let expected = text.iter().skip(at).position(|&b| b < 0x20 || b == b'"' || b == b'\\').map(|i| at + i);
            prop_assert_eq!(plain_run_end(&text, at), expected);
        }

        #[test]
        fn a_common_prefix_is_counted_to_the_first_byte_that_differs(
            a in prop::collection::vec(prop::sample::select(vec![b'a', b'b']), 0..70),
            b in prop::collection::vec(prop::sample::select(vec![b'a', b'b']), 0..70),
            shared in 0usize..70,
        ) {
            // Mostly alike, as the texts compared are.
            let mut b = b;
            let shared = shared.min(a.len()).min(b.len());
            b[..shared].copy_from_slice(&a[..shared]);
            let expected = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
            prop_assert_eq!(common_prefix(&a, &b), expected);
        }

        /// Read against a value serde_json wrote, a text made of it with
        /// any piece of it replaced by any text near JSON is read to the
        /// end serde_json reads it to, or not read; whatever starts were
        /// noted.
        #[test]
        fn a_value_read_against_another_ends_where_serde_json_ends_it(
            value in crate::test_support::json_value(),
            cut in (0usize..64, 0usize..8),
            piece in json_like(),
            noted in any::<u64>(),
        ) {
            let first = serde_json::to_string(&value).unwrap();
            let from = cut.0.min(first.len());
            let to = (from + cut.1).min(first.len());
            let second = format!("{}{piece}{}", &first[..from], &first[to..]);
            let (read, _) = against(&first, &second, |i| noted >> (i % 64) & 1 == 1);
            if let Some(end) = read {
                let text = format!("[{first},{second}]");
                let at = first.len() + 2;
                prop_assert_eq!(serde_end(&text[at..]).map(|end| at + end), Some(end), "{}", second);
            }
        }

        /// A list of items alike, each with any piece replaced by any text
        /// near JSON: where its items are read against each other, it is
        /// read to the end serde_json reads it to, or not read, and it notes
        /// the starts a read of each item alone notes.
        #[test]
        fn a_list_of_items_alike_is_read_as_serde_json_reads_it(
            value in crate::test_support::json_value(),
            cuts in prop::collection::vec((0usize..64, 0usize..8, json_like(), any::<bool>()), 1..6),
        ) {
            let item = serde_json::to_string(&value).unwrap();
            let items: Vec<String> = cuts
                .iter()
                .map(|(from, len, piece, changed)| {
                    let from = (*from).min(item.len());
                    let to = (from + len).min(item.len());
                    if *changed { format!("{}{piece}{}", &item[..from], &item[to..]) } else { item.clone() }
                })
                .collect();
            let text = format!("[{}],", items.join(","));
            let ((end, against), (_, alone)) = noted_both_ways(&text);
            if let Some(end) = end {
                prop_assert_eq!(serde_end(&text), Some(end), "{}", text);
                prop_assert_eq!(&against, &alone, "{}", text);
            }
            // Where the items are what serde_json writes, it answers.
            if cuts.iter().all(|(.., changed)| !changed) {
                prop_assert_eq!(end, Some(text.len() - 1));
            }
        }

        /// On values serde_json writes, it answers, and at their end.
        #[test]
        fn it_reads_what_serde_json_writes(value in crate::test_support::json_value()) {
            for text in [serde_json::to_string(&value).unwrap(), serde_json::to_string_pretty(&value).unwrap()] {
                prop_assert_eq!(value_end(text.as_bytes(), 0), Some(text.len()));
            }
        }
    }
}
