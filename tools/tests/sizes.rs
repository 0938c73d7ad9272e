//! The house's size rules, checked on every hand-written source file of the
//! repository: no file over 1,500 lines, no function over 150. Generated
//! files (the C headers, the fuzz corpus) are not sources and are skipped;
//! a declarative clap enum is a type, not a function, so it is not counted.
//! `cargo test -p ulnic-tools --test sizes -- --nocapture` lists the
//! longest.

use std::path::{Path, PathBuf};

const MAX_FILE_LINES: usize = 1500;
const MAX_FN_LINES: usize = 150;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Every hand-written source file: Rust, C, Lua and shell, outside build
/// output and the fuzz corpus.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if path.is_dir() {
            if !matches!(name.as_str(), "target" | ".git" | "corpus" | "artifacts") {
                sources(&path, out);
            }
            continue;
        }
        if matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("rs" | "c" | "lua" | "sh")
        ) {
            out.push(path);
        }
    }
}

/// `text` with the contents of comments, strings and character literals
/// blanked, lines kept: braces in them no longer count.
fn blank(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let keep = |ch: char, out: &mut String| out.push(if ch == '\n' { '\n' } else { ' ' });
    while i < c.len() {
        match c[i] {
            '/' if c.get(i + 1) == Some(&'/') => {
                while i < c.len() && c[i] != '\n' {
                    i += 1;
                }
            }
            '/' if c.get(i + 1) == Some(&'*') => {
                i += 2;
                while i < c.len() && !(c[i] == '*' && c.get(i + 1) == Some(&'/')) {
                    keep(c[i], &mut out);
                    i += 1;
                }
                i += 2;
            }
            'r' if c.get(i + 1) == Some(&'#') || (c.get(i + 1) == Some(&'"')) => {
                // A raw string: r"..." or r#"..."#.
                let mut hashes = 0;
                let mut j = i + 1;
                while c.get(j) == Some(&'#') {
                    hashes += 1;
                    j += 1;
                }
                if c.get(j) != Some(&'"') {
                    out.push(c[i]);
                    i += 1;
                    continue;
                }
                i = j + 1;
                loop {
                    if i >= c.len() {
                        break;
                    }
                    if c[i] == '"' && (0..hashes).all(|k| c.get(i + 1 + k) == Some(&'#')) {
                        i += 1 + hashes;
                        break;
                    }
                    keep(c[i], &mut out);
                    i += 1;
                }
            }
            '"' => {
                i += 1;
                while i < c.len() && c[i] != '"' {
                    if c[i] == '\\' {
                        keep(c[i], &mut out);
                        i += 1;
                    }
                    if i < c.len() {
                        keep(c[i], &mut out);
                        i += 1;
                    }
                }
                i += 1;
            }
            '\'' => {
                // A character literal ('x', '\n', '\''), or a lifetime.
                let len = match (c.get(i + 1), c.get(i + 2)) {
                    // The escaped character, then the closing quote.
                    (Some('\\'), Some(_)) => c
                        .get(i + 3..)
                        .and_then(|rest| rest.iter().position(|&x| x == '\''))
                        .map(|p| p + 4),
                    (Some(_), Some('\'')) => Some(3),
                    _ => None,
                };
                match len {
                    Some(n) => i += n,
                    None => {
                        out.push('\'');
                        i += 1;
                    }
                }
            }
            ch => {
                out.push(ch);
                i += 1;
            }
        }
    }
    out
}

/// Each Rust function's name and length in lines, from its `fn` line to
/// the brace that closes its body.
fn rust_functions(text: &str) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (start, line) in lines.iter().enumerate() {
        let t = line.trim_start();
        let Some(at) = t.find("fn ") else { continue };
        let head = &t[..at];
        let prefix_ok = head.split_whitespace().all(|w| {
            matches!(
                w,
                "pub"
                    | "pub(crate)"
                    | "pub(super)"
                    | "const"
                    | "unsafe"
                    | "async"
                    | "extern"
                    | "\"C\""
            )
        }) && (at == 0 || t[..at].ends_with(' '));
        if !prefix_ok {
            continue;
        }
        let name: String = t[at + 3..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if name.is_empty() {
            continue;
        }
        // The body: the first `{` after the signature, to its match (a
        // declaration ending in `;` first has none).
        let mut depth = 0i32;
        let mut opened = false;
        let mut end = None;
        'scan: for (k, l) in lines.iter().enumerate().skip(start) {
            for ch in l.chars() {
                match ch {
                    ';' if !opened && depth == 0 => break 'scan,
                    '{' => {
                        depth += 1;
                        opened = true;
                    }
                    '}' => {
                        depth -= 1;
                        if opened && depth == 0 {
                            end = Some(k);
                            break 'scan;
                        }
                    }
                    _ => {}
                }
            }
        }
        if let Some(end) = end {
            out.push((name, start + 1, end - start + 1));
        }
    }
    out
}

/// Each C function's name and length: kernel style, the body's braces on
/// lines of their own at the first column.
fn c_functions(text: &str) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (open, l) in lines.iter().enumerate() {
        if *l != "{" || open == 0 {
            continue;
        }
        // The signature starts at the last line before that begins at
        // the first column with a name.
        let mut start = open - 1;
        while start > 0 && lines[start].starts_with([' ', '\t']) {
            start -= 1;
        }
        let Some(close) = (open..lines.len()).find(|&k| lines[k] == "}") else {
            continue;
        };
        let name = lines[start]
            .split('(')
            .next()
            .and_then(|s| s.split_whitespace().last())
            .unwrap_or("?")
            .trim_start_matches('*')
            .to_string();
        out.push((name, start + 1, close - start + 1));
    }
    out
}

#[test]
fn hand_written_sources_stay_small() {
    let mut files = Vec::new();
    sources(&root(), &mut files);
    assert!(files.len() > 100, "only {} sources found", files.len());
    let mut too_long = Vec::new();
    let mut functions = Vec::new();
    for path in &files {
        let text = std::fs::read_to_string(path).unwrap();
        let rel = path.strip_prefix(root()).unwrap().display().to_string();
        let lines = text.lines().count();
        if lines > MAX_FILE_LINES {
            too_long.push(format!("{rel}: {lines} lines (at most {MAX_FILE_LINES})"));
        }
        let found = match path.extension().and_then(|e| e.to_str()) {
            Some("rs") => rust_functions(&blank(&text)),
            Some("c") => c_functions(&blank(&text)),
            _ => Vec::new(),
        };
        functions.extend(
            found
                .into_iter()
                .map(|(n, at, len)| (len, format!("{rel}:{at} {n}"))),
        );
    }
    functions.sort_by_key(|f| std::cmp::Reverse(f.0));
    eprintln!("the longest functions:");
    for (len, what) in functions.iter().take(12) {
        eprintln!("  {len:>4} {what}");
    }
    for (len, what) in functions.iter().take_while(|f| f.0 > MAX_FN_LINES) {
        too_long.push(format!("{what}: {len} lines (at most {MAX_FN_LINES})"));
    }
    assert!(too_long.is_empty(), "too long:\n{}", too_long.join("\n"));
}

/// The scanners find what they should: a function's length with braces in
/// strings and characters, and a C function in kernel style.
#[test]
fn the_size_check_measures_functions() {
    let rust = "fn a() {\n    let s = \"}}{\";\n    let c = '}';\n    let q = '\\'';\n    // }\n}\nfn b<'x>(v: &'x u8) -> u8 {\n    *v\n}\n";
    let got = rust_functions(&blank(rust));
    assert_eq!(got, [("a".to_string(), 1, 6), ("b".to_string(), 7, 3)]);
    let c = "static int f(int x,\n\t     int y)\n{\n\treturn x; /* } */\n}\n";
    assert_eq!(c_functions(&blank(c)), [("f".to_string(), 1, 5)]);
}
