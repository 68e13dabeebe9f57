//! A small, strict XML reader and writer for topology files.
//!
//! Only what topology files use: an optional `<?xml ...?>` declaration,
//! comments, elements with quoted attributes (five predefined entities and
//! numeric character references in values), self-closing tags, and whitespace
//! between elements. Text content, CDATA, DOCTYPE and processing instructions
//! elsewhere are errors. Every error names the line (and the element where
//! there is one). Limits keep a hostile file from costing more than a linear
//! scan: [`MAX_INPUT`] bytes, [`MAX_DEPTH`] levels, [`MAX_ELEMENTS`] elements,
//! [`MAX_ATTRS`] attributes per element, [`MAX_NAME`] bytes per name and
//! [`MAX_VALUE`] bytes per value.

use std::fmt;

/// Largest file accepted: a 64-GPU machine with every link written is ~200 KiB.
pub const MAX_INPUT: usize = 1 << 20;
/// Deepest nesting: system > cpu > 6 PCI switch levels > gpu > nvlink is 10.
pub const MAX_DEPTH: usize = 32;
/// Most elements in one file.
pub const MAX_ELEMENTS: usize = 20_000;
/// Most attributes on one element.
pub const MAX_ATTRS: usize = 32;
/// Longest element or attribute name.
pub const MAX_NAME: usize = 64;
/// Longest attribute value (after entity expansion).
pub const MAX_VALUE: usize = 1024;

/// One element: name, attributes in file order, children, and its line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Element {
    pub name: String,
    pub attrs: Vec<(String, String)>,
    pub children: Vec<Element>,
    /// 1-based line of its `<`.
    pub line: usize,
}

impl Element {
    pub fn new(name: &str) -> Element {
        Element {
            name: name.to_string(),
            attrs: Vec::new(),
            children: Vec::new(),
            line: 0,
        }
    }
    /// An attribute's value.
    pub fn attr(&self, k: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
    }
    /// Adds an attribute (builder style).
    pub fn with(mut self, k: &str, v: impl fmt::Display) -> Element {
        self.attrs.push((k.to_string(), v.to_string()));
        self
    }
}

/// A malformed file: where, and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XmlError {
    pub line: usize,
    pub msg: String,
}

impl fmt::Display for XmlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.msg)
    }
}

impl std::error::Error for XmlError {}

struct Parser<'a> {
    s: &'a [u8],
    pos: usize,
    line: usize,
    elements: usize,
}

fn is_name_start(b: u8) -> bool {
    b.is_ascii_alphabetic() || b == b'_' || b == b':'
}

fn is_name_char(b: u8) -> bool {
    is_name_start(b) || b.is_ascii_digit() || b == b'-' || b == b'.'
}

impl Parser<'_> {
    fn err<T>(&self, msg: impl Into<String>) -> Result<T, XmlError> {
        Err(XmlError {
            line: self.line,
            msg: msg.into(),
        })
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.pos).copied()
    }

    fn starts(&self, p: &str) -> bool {
        self.s[self.pos..].starts_with(p.as_bytes())
    }

    fn bump(&mut self) {
        if self.s.get(self.pos) == Some(&b'\n') {
            self.line += 1;
        }
        self.pos += 1;
    }

    fn skip_ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\r' | b'\n')) {
            self.bump();
        }
    }

    /// Skips `<!-- ... -->` (the position is at `<!--`).
    fn comment(&mut self) -> Result<(), XmlError> {
        let start = self.line;
        self.pos += 4;
        while self.pos < self.s.len() {
            if self.starts("-->") {
                self.pos += 3;
                return Ok(());
            }
            self.bump();
        }
        Err(XmlError {
            line: start,
            msg: "comment not closed (no '-->')".into(),
        })
    }

    /// Whitespace and comments between elements.
    fn misc(&mut self) -> Result<(), XmlError> {
        loop {
            self.skip_ws();
            if self.starts("<!--") {
                self.comment()?;
            } else {
                return Ok(());
            }
        }
    }

    fn name(&mut self, what: &str) -> Result<String, XmlError> {
        let start = self.pos;
        match self.peek() {
            Some(b) if is_name_start(b) => {}
            Some(b) => return self.err(format!("expected {what}, found {:?}", b as char)),
            None => return self.err(format!("expected {what}, found the end of the file")),
        }
        while self.peek().is_some_and(is_name_char) {
            self.pos += 1;
            if self.pos - start > MAX_NAME {
                return self.err(format!("{what} longer than {MAX_NAME} bytes"));
            }
        }
        // Names are ASCII by construction.
        Ok(String::from_utf8_lossy(&self.s[start..self.pos]).into_owned())
    }

    fn entity(&mut self, elem: &str, out: &mut String) -> Result<(), XmlError> {
        let end = self.s[self.pos..].iter().take(12).position(|&b| b == b';');
        let Some(end) = end else {
            return self.err(format!("<{elem}>: '&' that starts no entity (write &amp;)"));
        };
        let ent = String::from_utf8_lossy(&self.s[self.pos + 1..self.pos + end]).into_owned();
        let c = match ent.as_str() {
            "lt" => Some('<'),
            "gt" => Some('>'),
            "amp" => Some('&'),
            "quot" => Some('"'),
            "apos" => Some('\''),
            e => {
                let code = if let Some(h) = e.strip_prefix("#x") {
                    u32::from_str_radix(h, 16).ok()
                } else if let Some(d) = e.strip_prefix('#') {
                    d.parse::<u32>().ok()
                } else {
                    None
                };
                code.and_then(char::from_u32)
            }
        };
        match c {
            Some(c) => {
                out.push(c);
                self.pos += end + 1;
                Ok(())
            }
            None => self.err(format!("<{elem}>: unknown entity '&{ent};'")),
        }
    }

    fn value(&mut self, elem: &str, attr: &str) -> Result<String, XmlError> {
        let q = match self.peek() {
            Some(q @ (b'"' | b'\'')) => q,
            _ => return self.err(format!("<{elem}>: value of '{attr}' must be quoted")),
        };
        self.pos += 1;
        let mut bytes = Vec::new();
        let mut out = String::new();
        loop {
            match self.peek() {
                None => return self.err(format!("<{elem}>: value of '{attr}' not closed")),
                Some(b) if b == q => {
                    self.pos += 1;
                    break;
                }
                Some(b'<') => {
                    return self.err(format!("<{elem}>: '<' inside the value of '{attr}'"))
                }
                Some(b'&') => {
                    out.push_str(&self.flush(&mut bytes, elem)?);
                    self.entity(elem, &mut out)?;
                }
                Some(b) => {
                    bytes.push(b);
                    self.bump();
                }
            }
            if out.len() + bytes.len() > MAX_VALUE {
                return self.err(format!(
                    "<{elem}>: value of '{attr}' longer than {MAX_VALUE} bytes"
                ));
            }
        }
        out.push_str(&self.flush(&mut bytes, elem)?);
        Ok(out)
    }

    fn flush(&self, bytes: &mut Vec<u8>, elem: &str) -> Result<String, XmlError> {
        let s = std::mem::take(bytes);
        String::from_utf8(s)
            .or_else(|_| self.err(format!("<{elem}>: attribute value is not UTF-8")))
    }

    /// An element at `<` (not a comment or end tag), with its children.
    fn element(&mut self, depth: usize) -> Result<Element, XmlError> {
        if depth > MAX_DEPTH {
            return self.err(format!("elements nested deeper than {MAX_DEPTH}"));
        }
        self.elements += 1;
        if self.elements > MAX_ELEMENTS {
            return self.err(format!("more than {MAX_ELEMENTS} elements"));
        }
        let line = self.line;
        self.pos += 1;
        let name = self.name("an element name")?;
        let mut el = Element {
            name,
            attrs: Vec::new(),
            children: Vec::new(),
            line,
        };
        // Attributes.
        loop {
            let before = self.pos;
            self.skip_ws();
            match self.peek() {
                Some(b'/') => {
                    self.pos += 1;
                    if self.peek() != Some(b'>') {
                        return self.err(format!("<{}>: expected '>' after '/'", el.name));
                    }
                    self.pos += 1;
                    return Ok(el);
                }
                Some(b'>') => {
                    self.pos += 1;
                    break;
                }
                None => return self.err(format!("<{}>: tag not closed", el.name)),
                Some(_) if self.pos == before => {
                    return self.err(format!(
                        "<{}>: expected whitespace before an attribute",
                        el.name
                    ))
                }
                Some(_) => {}
            }
            let k = self.name("an attribute name")?;
            self.skip_ws();
            if self.peek() != Some(b'=') {
                return self.err(format!("<{}>: attribute '{k}' has no '='", el.name));
            }
            self.pos += 1;
            self.skip_ws();
            let v = self.value(&el.name, &k)?;
            if el.attr(&k).is_some() {
                return self.err(format!("<{}>: attribute '{k}' given twice", el.name));
            }
            if el.attrs.len() >= MAX_ATTRS {
                return self.err(format!("<{}>: more than {MAX_ATTRS} attributes", el.name));
            }
            el.attrs.push((k, v));
        }
        // Children until the end tag.
        loop {
            self.misc()?;
            if self.starts("</") {
                self.pos += 2;
                let end = self.name("an end tag name")?;
                self.skip_ws();
                if self.peek() != Some(b'>') {
                    return self.err(format!("</{end}>: expected '>'"));
                }
                self.pos += 1;
                if end != el.name {
                    return self.err(format!(
                        "</{end}> closes <{}> (opened on line {})",
                        el.name, el.line
                    ));
                }
                return Ok(el);
            }
            match self.peek() {
                Some(b'<') => {
                    if self.starts("<!") || self.starts("<?") {
                        return self.err(format!(
                            "<{}>: declarations, CDATA and processing instructions are not allowed here",
                            el.name
                        ));
                    }
                    let child = self.element(depth + 1)?;
                    el.children.push(child);
                }
                None => {
                    return self.err(format!(
                        "<{}> (opened on line {}) is never closed",
                        el.name, el.line
                    ))
                }
                Some(_) => {
                    return self.err(format!(
                        "<{}>: text content is not allowed (only elements)",
                        el.name
                    ))
                }
            }
        }
    }
}

/// Parses a whole document into its root element.
pub fn parse(text: &str) -> Result<Element, XmlError> {
    if text.len() > MAX_INPUT {
        return Err(XmlError {
            line: 1,
            msg: format!("file larger than {MAX_INPUT} bytes"),
        });
    }
    let mut p = Parser {
        s: text.as_bytes(),
        pos: 0,
        line: 1,
        elements: 0,
    };
    if p.starts("\u{feff}") {
        p.pos += 3;
    }
    p.misc()?;
    if p.starts("<?xml") {
        let line = p.line;
        while p.pos < p.s.len() && !p.starts("?>") {
            p.bump();
        }
        if p.pos >= p.s.len() {
            return Err(XmlError {
                line,
                msg: "<?xml declaration not closed".into(),
            });
        }
        p.pos += 2;
    }
    p.misc()?;
    match p.peek() {
        Some(b'<') if !p.starts("<!") && !p.starts("<?") && !p.starts("</") => {}
        Some(_) => return p.err("expected the root element"),
        None => return p.err("empty document: no root element"),
    }
    let root = p.element(1)?;
    p.misc()?;
    if p.pos < p.s.len() {
        return p.err(format!("content after the root element </{}>", root.name));
    }
    Ok(root)
}

fn escape(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '<' => s.push_str("&lt;"),
            '>' => s.push_str("&gt;"),
            '&' => s.push_str("&amp;"),
            '"' => s.push_str("&quot;"),
            '\n' => s.push_str("&#10;"),
            c => s.push(c),
        }
    }
    s
}

fn write_el(e: &Element, depth: usize, out: &mut String) {
    for _ in 0..depth {
        out.push_str("  ");
    }
    out.push('<');
    out.push_str(&e.name);
    for (k, v) in &e.attrs {
        out.push(' ');
        out.push_str(k);
        out.push_str("=\"");
        out.push_str(&escape(v));
        out.push('"');
    }
    if e.children.is_empty() {
        out.push_str("/>\n");
        return;
    }
    out.push_str(">\n");
    for c in &e.children {
        write_el(c, depth + 1, out);
    }
    for _ in 0..depth {
        out.push_str("  ");
    }
    out.push_str("</");
    out.push_str(&e.name);
    out.push_str(">\n");
}

/// The document as text, two-space indented, with no declaration.
pub fn write(root: &Element) -> String {
    let mut s = String::new();
    write_el(root, 0, &mut s);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let t = "<?xml version=\"1.0\"?>\n<!-- c -->\n<system version=\"1\">\n  <cpu numaid='0' x=\"a&amp;b&#65;\"/>\n</system>\n";
        let r = parse(t).unwrap();
        assert_eq!(r.name, "system");
        assert_eq!(r.children[0].attr("x"), Some("a&bA"));
        assert_eq!(r.children[0].line, 4);
        let again = parse(&write(&r)).unwrap();
        assert_eq!(again.children[0].attrs, r.children[0].attrs);
    }

    #[test]
    fn errors_name_line_and_element() {
        let e = parse("<a>\n<b>\n</a>").unwrap_err();
        assert_eq!(e.line, 3);
        assert!(e.msg.contains("</a> closes <b>"), "{e}");
        let e = parse("<a>\n  text\n</a>").unwrap_err();
        assert!(e.to_string().starts_with("line 2: <a>: text"), "{e}");
        assert!(parse("<a x=1/>").unwrap_err().msg.contains("quoted"));
        assert!(parse("<a x='1' x='2'/>").unwrap_err().msg.contains("twice"));
        assert!(parse("<a/><b/>")
            .unwrap_err()
            .msg
            .contains("after the root"));
        assert!(parse("").unwrap_err().msg.contains("empty"));
        assert!(parse("<a x='&bogus;'/>")
            .unwrap_err()
            .msg
            .contains("entity"));
        let deep = "<a>".repeat(MAX_DEPTH + 2);
        assert!(parse(&deep).unwrap_err().msg.contains("deeper"));
    }
}
