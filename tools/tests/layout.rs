//! The house rules of docs/architecture.md, checked on the source tree:
//!
//! - every crate is named after its folder: `ulnic-<last folder name>`;
//! - the NIC model (`ulnic-device`) and the contract (`ulnic-abi`) depend
//!   on no tool, image builder, driver or library crate;
//! - inside every crate, no module uses, directly or through others, a
//!   module that uses it back (its inline `#[cfg(test)] mod tests` aside).
//!
//! A module "uses" another when its code names it by a `crate::`,
//! `super::` or `self::` path, or names one of its own child modules; a
//! path is charged to the longest module prefix it has, so
//! `crate::nic::utlb::Table` is a use of `nic::utlb`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The workspace members, from the root manifest's `members` list.
fn members() -> Vec<String> {
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let start = manifest.find("members = [").expect("a members list");
    let end = start + manifest[start..].find(']').unwrap();
    manifest[start..end]
        .split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// The value of `key = "..."` in `[section]` of a manifest.
fn manifest_value(manifest: &str, section: &str, key: &str) -> Option<String> {
    let mut inside = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            inside = line == format!("[{section}]");
            continue;
        }
        if inside {
            if let Some(rest) = line.strip_prefix(key) {
                if let Some(v) = rest.trim_start().strip_prefix('=') {
                    return Some(v.trim().trim_matches('"').to_string());
                }
            }
        }
    }
    None
}

/// The dependency names of `[section]`.
fn dependencies(manifest: &str, section: &str) -> Vec<String> {
    let mut inside = false;
    let mut out = Vec::new();
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            inside = line == format!("[{section}]");
            continue;
        }
        if inside && !line.is_empty() && !line.starts_with('#') {
            let name = line.split(['=', '.', ' ']).next().unwrap();
            out.push(name.to_string());
        }
    }
    out
}

/// The package in `folder`: `ulnic-<folder>`, except the library, which
/// is the `ulnic` programs depend on and import.
fn package_name(folder: &str) -> String {
    match folder {
        "guest-lib" => "ulnic".into(),
        _ => format!(
            "ulnic-{}",
            Path::new(folder).file_name().unwrap().to_str().unwrap()
        ),
    }
}

#[test]
fn crates_are_named_after_their_folders() {
    let members = members();
    assert!(members.len() >= 6, "{members:?}");
    for m in &members {
        let manifest = std::fs::read_to_string(root().join(m).join("Cargo.toml")).unwrap();
        let name = manifest_value(&manifest, "package", "name").unwrap();
        assert_eq!(name, package_name(m), "the crate in {m}/ is named {name}");
    }
}

/// One name per crate: no dependency is renamed (`package = ...`), and a
/// crate's Rust name is its package's (`[lib] name` only renames what a C
/// program links, for crates that build no Rust library).
#[test]
fn every_crate_is_imported_under_its_package_name() {
    for m in members() {
        let manifest = std::fs::read_to_string(root().join(&m).join("Cargo.toml")).unwrap();
        assert!(
            !manifest.contains("package ="),
            "{m}/Cargo.toml renames a dependency"
        );
        if let Some(lib) = manifest_value(&manifest, "lib", "name") {
            let kinds = manifest_value(&manifest, "lib", "crate-type").unwrap_or_default();
            assert!(
                lib == package_name(&m).replace('-', "_")
                    || !(kinds.contains("\"lib\"") || kinds.contains("\"rlib\"")),
                "{m}: the Rust crate is named {lib}, not after its package"
            );
        }
    }
    // Sources name the library `ulnic`, never an old alias.
    for m in members() {
        for file in modules(&root().join(&m).join("src")).values() {
            let text = std::fs::read_to_string(file).unwrap();
            for old in ["ulnic_lib", "ulnic_guest_lib"] {
                assert!(!text.contains(old), "{} names {old}", file.display());
            }
        }
    }
}

#[test]
fn the_engine_and_the_contract_depend_on_no_tool() {
    let tools_only = [
        "ulnic-tools",
        "ulnic-images",
        "ulnic",
        "ulnic-host-attach",
        "clap",
        "serde",
        "serde_json",
        "anyhow",
    ];
    for (folder, allowed_workspace) in [("device", &["ulnic-abi"][..]), ("abi", &[][..])] {
        let manifest = std::fs::read_to_string(root().join(folder).join("Cargo.toml")).unwrap();
        for dep in dependencies(&manifest, "dependencies") {
            assert!(
                !tools_only.contains(&dep.as_str()),
                "{folder} depends on {dep}"
            );
            if dep.starts_with("ulnic") {
                assert!(
                    allowed_workspace.contains(&dep.as_str()),
                    "{folder} depends on {dep}"
                );
            }
        }
    }
}

/// A crate's modules: path (`nic::utlb`, "" for the root) -> source file.
fn modules(src: &Path) -> BTreeMap<String, PathBuf> {
    let mut out = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().and_then(|e| e.to_str()) != Some("rs") {
                continue;
            }
            let rel = path.strip_prefix(src).unwrap().with_extension("");
            let mut parts: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_str().unwrap().to_string())
                .collect();
            let last = parts.last().unwrap().as_str();
            if last == "mod" || (parts.len() == 1 && (last == "lib" || last == "main")) {
                parts.pop();
            }
            if parts.first().map(String::as_str) == Some("bin") {
                continue;
            }
            out.insert(parts.join("::"), path);
        }
    }
    out
}

/// The code of a file without comments, string contents and its trailing
/// `#[cfg(test)] mod tests`.
fn code(text: &str) -> String {
    // Code compiled only for tests (a `#[cfg(test)]` module, whatever its
    // name or visibility) is not part of the module graph.
    let text = match ["mod ", "pub mod ", "pub(crate) mod "]
        .iter()
        .filter_map(|m| text.find(&format!("#[cfg(test)]\n{m}")))
        .min()
    {
        Some(i) => &text[..i],
        None => text,
    };
    let mut out = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '/' if chars.peek() == Some(&'/') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            '"' => {
                let mut escaped = false;
                for c in chars.by_ref() {
                    if escaped {
                        escaped = false;
                    } else if c == '\\' {
                        escaped = true;
                    } else if c == '"' {
                        break;
                    }
                }
                out.push_str("\"\"");
            }
            _ => out.push(c),
        }
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Every path that starts at `at` in `s` (after its first segment): plain
/// `a::b::c`, or a use group `a::{b, c::{d, e}}`, flattened.
fn paths_from(s: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut prefix = Vec::new();
    let mut rest = s;
    loop {
        let ident: String = rest.chars().take_while(|&c| is_ident(c)).collect();
        if !ident.is_empty() {
            prefix.push(ident.clone());
            rest = &rest[ident.len()..];
            if let Some(r) = rest.strip_prefix("::") {
                rest = r;
                continue;
            }
            out.push(prefix);
            return out;
        }
        if let Some(r) = rest.strip_prefix('{') {
            let mut depth = 1;
            let mut item = String::new();
            let mut items = Vec::new();
            for c in r.chars() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 1 => {
                        items.push(std::mem::take(&mut item));
                        continue;
                    }
                    _ => {}
                }
                if depth == 0 {
                    break;
                }
                item.push(c);
            }
            items.push(item);
            for item in items {
                let item = item.trim();
                if item.is_empty() || item == "*" {
                    continue;
                }
                for tail in paths_from(item) {
                    let mut p = prefix.clone();
                    if tail.first().map(String::as_str) != Some("self") {
                        p.extend(tail);
                    }
                    out.push(p);
                }
            }
            return out;
        }
        out.push(prefix);
        return out;
    }
}

/// The modules `module` uses, given every module of its crate.
fn uses(module: &str, text: &str, all: &BTreeMap<String, PathBuf>) -> BTreeSet<String> {
    let code = code(text);
    let here: Vec<&str> = module.split("::").filter(|s| !s.is_empty()).collect();
    let mut found = BTreeSet::new();
    let bytes = code.as_bytes();
    let mut i = 0;
    while i < code.len() {
        if !is_ident(bytes[i] as char)
            || (i > 0 && (is_ident(bytes[i - 1] as char) || bytes[i - 1] == b':'))
        {
            i += 1;
            continue;
        }
        let word: String = code[i..].chars().take_while(|&c| is_ident(c)).collect();
        let after = i + word.len();
        if !code[after..].starts_with("::") {
            i = after;
            continue;
        }
        // The module this path starts from.
        let mut base: Vec<String> = match word.as_str() {
            "crate" => Vec::new(),
            "self" => here.iter().map(|s| s.to_string()).collect(),
            "super" => {
                let mut b: Vec<String> = here.iter().map(|s| s.to_string()).collect();
                b.pop();
                b
            }
            child => {
                let mut b: Vec<String> = here.iter().map(|s| s.to_string()).collect();
                b.push(child.to_string());
                if !all.contains_key(&b.join("::")) {
                    i = after;
                    continue;
                }
                b.pop();
                // The child's own name is the first segment of the path.
                for path in paths_from(&code[i..]) {
                    charge(&b, &path, module, all, &mut found);
                }
                i = after;
                continue;
            }
        };
        let mut rest = &code[after + 2..];
        while let Some(r) = rest.strip_prefix("super::") {
            base.pop();
            rest = r;
        }
        for path in paths_from(rest) {
            charge(&base, &path, module, all, &mut found);
        }
        i = after;
    }
    found
}

/// Charges `base::path` to the longest module prefix it has.
fn charge(
    base: &[String],
    path: &[String],
    module: &str,
    all: &BTreeMap<String, PathBuf>,
    found: &mut BTreeSet<String>,
) {
    let mut full: Vec<String> = base.to_vec();
    full.extend(path.iter().cloned());
    let target = (0..=full.len())
        .rev()
        .map(|n| full[..n].join("::"))
        .find(|m| all.contains_key(m))
        .unwrap_or_default();
    if target != module {
        found.insert(target);
    }
}

/// A cycle in `graph`, if any, as the modules along it.
fn cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        m: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(m.to_string(), 1);
        path.push(m.to_string());
        for next in graph.get(m).into_iter().flatten() {
            match state.get(next.as_str()).copied().unwrap_or(0) {
                1 => {
                    let from = path.iter().position(|p| p == next).unwrap();
                    let mut c = path[from..].to_vec();
                    c.push(next.clone());
                    return Some(c);
                }
                0 => {
                    if let Some(c) = visit(next, graph, state, path) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        path.pop();
        state.insert(m.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for m in graph.keys() {
        if state.get(m.as_str()).copied().unwrap_or(0) == 0 {
            if let Some(c) = visit(m, graph, &mut state, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

/// The module graph of the crate whose sources are in `src`.
fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let all = modules(src);
    all.iter()
        .map(|(m, file)| {
            let text = std::fs::read_to_string(file).unwrap();
            (m.clone(), uses(m, &text, &all))
        })
        .collect()
}

#[test]
fn no_crate_has_an_import_circle() {
    let mut circles = Vec::new();
    for m in members() {
        let src = root().join(&m).join("src");
        let g = graph(&src);
        if let Some(c) = cycle(&g) {
            let names: Vec<String> = c
                .iter()
                .map(|s| {
                    if s.is_empty() {
                        "(root)".into()
                    } else {
                        s.clone()
                    }
                })
                .collect();
            circles.push(format!("{m}: {}", names.join(" -> ")));
        }
    }
    assert!(
        circles.is_empty(),
        "modules import each other:\n{}",
        circles.join("\n")
    );
}

/// The checker itself finds the circles it is meant to find.
#[test]
fn the_circle_check_sees_circles() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir_all(src.join("bench")).unwrap();
    std::fs::write(src.join("lib.rs"), "pub mod bench;\npub mod a;\n").unwrap();
    std::fs::write(src.join("a.rs"), "use crate::bench::{x::Y, z};\n").unwrap();
    std::fs::write(src.join("bench/mod.rs"), "pub mod x;\npub mod z;\n").unwrap();
    std::fs::write(
        src.join("bench/x.rs"),
        "// crate::a in a comment is no use\npub struct Y;\n",
    )
    .unwrap();
    std::fs::write(src.join("bench/z.rs"), "fn f() { super::x::Y; }\n").unwrap();
    let g = graph(src);
    assert_eq!(cycle(&g), None, "{g:?}");
    assert_eq!(
        g["a"],
        BTreeSet::from(["bench::x".to_string(), "bench::z".to_string()])
    );
    // z -> x -> a -> z.
    std::fs::write(
        src.join("bench/x.rs"),
        "pub struct Y;\nfn f() { let _ = crate::a::g(); }\n",
    )
    .unwrap();
    let g = graph(src);
    assert!(cycle(&g).is_some(), "{g:?}");
    // The root using a child, the child using the root.
    std::fs::write(src.join("bench/x.rs"), "use crate::Thing;\n").unwrap();
    std::fs::write(
        src.join("lib.rs"),
        "pub mod bench;\npub mod a;\nfn f() { bench::x::Y; }\n",
    )
    .unwrap();
    assert!(cycle(&graph(src)).is_some());
}

/// The module files a crate's `## Inside` table of docs/architecture.md
/// must list: every source file but the crate root.
fn listable(src: &Path) -> BTreeMap<String, String> {
    modules(src)
        .into_iter()
        .filter(|(m, _)| !m.is_empty())
        .map(|(m, file)| {
            let rel = file.strip_prefix(src).unwrap().display().to_string();
            (rel, m)
        })
        .collect()
}

/// The rows of the table under `## Inside \`{folder}/\`` in `doc`: the
/// first cell of each, without its backticks.
fn listed(doc: &str, folder: &str) -> Option<Vec<String>> {
    let heading = format!("## Inside `{folder}/`");
    let start = doc.lines().position(|l| l.starts_with(&heading))?;
    Some(
        doc.lines()
            .skip(start + 1)
            .take_while(|l| !l.starts_with("## "))
            .filter_map(|l| l.strip_prefix("| `"))
            .filter_map(|l| l.split('`').next())
            .map(str::to_string)
            .collect(),
    )
}

/// The first line of a file's `//!` doc comment: a table row's draft.
fn summary(file: &Path) -> String {
    std::fs::read_to_string(file)
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("//! "))
        .unwrap_or("")
        .to_string()
}

/// A table for `src` listing its modules in an order the check accepts
/// (each after those it uses), for the failure message.
fn suggested_table(src: &Path) -> String {
    let files = listable(src);
    let by_module: BTreeMap<String, String> =
        files.iter().map(|(f, m)| (m.clone(), f.clone())).collect();
    let g = graph(src);
    let mut placed: Vec<String> = Vec::new();
    while placed.len() < files.len() {
        let before = placed.len();
        for (m, f) in &by_module {
            let ready = g[m]
                .iter()
                .all(|u| u.is_empty() || u == m || placed.contains(&by_module[u]));
            if !placed.contains(f) && ready {
                placed.push(f.clone());
            }
        }
        if placed.len() == before {
            break; // a circle: the circle test says which
        }
    }
    placed
        .iter()
        .map(|f| format!("| `{f}` | {} |", summary(&src.join(f))))
        .collect::<Vec<_>>()
        .join("\n")
}

/// docs/architecture.md lists every module of every crate, bottom up: a
/// module uses only modules listed above it. A failure prints a table that
/// passes, with each module's first doc line as a draft.
#[test]
fn architecture_md_lists_every_module_in_dependency_order() {
    let doc = std::fs::read_to_string(root().join("docs/architecture.md")).unwrap();
    let mut problems = Vec::new();
    for m in members() {
        let src = root().join(&m).join("src");
        let files = listable(&src);
        if files.is_empty() {
            continue;
        }
        let Some(rows) = listed(&doc, &m) else {
            problems.push(format!(
                "{m}: no '## Inside `{m}/`' table; one that passes:\n{}",
                suggested_table(&src)
            ));
            continue;
        };
        let missing: Vec<&String> = files.keys().filter(|f| !rows.contains(f)).collect();
        let extra: Vec<&String> = rows.iter().filter(|r| !files.contains_key(*r)).collect();
        let g = graph(&src);
        let mut out_of_order = Vec::new();
        for (i, row) in rows.iter().enumerate() {
            let Some(module) = files.get(row) else {
                continue;
            };
            for used in &g[module] {
                let Some(file) = files.iter().find(|(_, m)| *m == used).map(|(f, _)| f) else {
                    continue; // the crate root
                };
                if !rows[..i].contains(file) {
                    out_of_order.push(format!("{row} uses {file}, listed after it"));
                }
            }
        }
        if !(missing.is_empty() && extra.is_empty() && out_of_order.is_empty()) {
            problems.push(format!(
                "{m}: missing {missing:?}, not modules {extra:?}, out of order {out_of_order:?}; one that passes:\n{}",
                suggested_table(&src)
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));
}

/// Every stored proptest regression file is replayed: proptest reads
/// `<crate>/proptest-regressions/<path>.txt` for the `proptest!` blocks of
/// `<crate>/src/<path>.rs`, so a file whose source moved or lost its
/// property tests would silently keep seeds nobody runs.
#[test]
fn every_proptest_regression_file_is_read_by_its_test() {
    let mut orphans = Vec::new();
    let mut found = 0;
    for m in members() {
        let dir = root().join(&m).join("proptest-regressions");
        let mut stack = vec![dir.clone()];
        while let Some(d) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&d) else {
                continue;
            };
            for entry in entries {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                    continue;
                }
                found += 1;
                let rel = path.strip_prefix(&dir).unwrap().with_extension("rs");
                let source = root().join(&m).join("src").join(&rel);
                let reads =
                    std::fs::read_to_string(&source).is_ok_and(|text| text.contains("proptest!"));
                if !reads {
                    orphans.push(format!(
                        "{} (no proptest! in {})",
                        path.display(),
                        source.display()
                    ));
                }
            }
        }
    }
    assert!(found >= 3, "only {found} regression files found");
    assert!(
        orphans.is_empty(),
        "regression files no test reads:\n{}",
        orphans.join("\n")
    );
}
