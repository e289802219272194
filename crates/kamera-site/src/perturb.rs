//! A seeded layout perturbation of the demo site, as a redesign would change it: the menu
//! reordered and its "Orders" entry renamed, an order page's "Track this shipment" link turned
//! into a button with another label, the shipping form's field moved after its button, both
//! renamed and given other HTML ids, the order table's rows reversed. Data, paths and page titles stay,
//! so a task keeps its answer; what a recorded selector found may not be found again. It is what
//! the agent's action cache is tested against (self-healing replay).
//!
//! ```
//! let plain = kamera_site::generate(7);
//! let moved = kamera_site::generate_with(7, Some(1));
//! assert_eq!(plain.keys().collect::<Vec<_>>(), moved.keys().collect::<Vec<_>>());
//! assert_ne!(plain["/orders"], moved["/orders"]);
//! assert_eq!(moved, kamera_site::generate_with(7, Some(1)));
//! ```

use std::collections::BTreeMap;

use crate::Rng;

/// The menu of every page, as the layout writes it.
const NAV: [(&str, &str); 5] = [
    ("/", "Home"),
    ("/orders", "Orders"),
    ("/shipping", "Shipping status"),
    ("/catalogue", "Catalogue"),
    ("/people", "Directory"),
];
const ORDERS_LABELS: [&str; 3] = ["Order list", "Purchases", "Order history"];
const TRACK_LABELS: [&str; 3] = ["Where is my parcel?", "Follow the parcel", "Parcel status"];
const GO_LABELS: [&str; 3] = ["Look up", "Find", "Search"];
const FIELD_IDS: [&str; 3] = ["parcel-code", "code", "shipment-ref"];
const BUTTON_IDS: [&str; 3] = ["lookup", "find-it", "send"];
const TRACK_LINK: &str = "<p><a href=\"/shipping\">Track this shipment</a></p>";

fn nav_html(links: &[(&str, &str)]) -> String {
    let a: Vec<String> = links.iter().map(|(h, t)| format!("<a href=\"{h}\">{t}</a>")).collect();
    format!("<nav>{}</nav>", a.join(" "))
}

/// Rewrites the pages of `site` (as [`crate::generate`] made them) for perturbation seed `p`.
pub fn apply(site: &mut BTreeMap<String, Vec<u8>>, p: u64) {
    let mut r = Rng(p ^ 0x0070_6572_7475_7262);
    let mut nav = NAV.to_vec();
    // Fisher-Yates; a shuffle that leaves the order as it was is turned once more.
    for i in (1..nav.len()).rev() {
        nav.swap(i, r.below(i + 1));
    }
    if nav == NAV {
        nav.rotate_left(1);
    }
    let orders = r.pick(&ORDERS_LABELS);
    for l in nav.iter_mut().filter(|l| l.0 == "/orders") {
        l.1 = orders;
    }
    let (old_nav, new_nav) = (nav_html(&NAV), nav_html(&nav));
    let track = r.pick(&TRACK_LABELS);
    let track_button = format!("<p><button type=\"button\" onclick=\"location.href='/shipping'\">{track}</button></p>");
    let (go, field, button) = (r.pick(&GO_LABELS), r.pick(&FIELD_IDS), r.pick(&BUTTON_IDS));
    let form = format!(
        "<form id=\"track\" onsubmit=\"location.href='/shipping/' + encodeURIComponent(document.getElementById('{field}').value.trim()); return false;\">\
         <button id=\"{button}\" type=\"submit\">{go}</button> <label>Tracking number <input id=\"{field}\" placeholder=\"Tracking number\"></label></form>"
    );
    for (path, bytes) in site.iter_mut() {
        if path.ends_with(".css") {
            continue;
        }
        let mut html = String::from_utf8_lossy(bytes).replace(&old_nav, &new_nav);
        html = html.replace(TRACK_LINK, &track_button);
        if path == "/shipping" {
            html = replace_between(&html, "<form id=\"track\"", "</form>", &form);
        }
        if path == "/orders" {
            html = reverse_rows(&html);
        }
        *bytes = html.into_bytes();
    }
}

/// `s` with the first span from `start` through `end` replaced by `with`.
fn replace_between(s: &str, start: &str, end: &str, with: &str) -> String {
    match s
        .find(start)
        .and_then(|i| s[i..].find(end).map(|j| (i, i + j + end.len())))
    {
        Some((i, j)) => format!("{}{with}{}", &s[..i], &s[j..]),
        None => s.to_string(),
    }
}

/// The order table with its data rows (after the header row) in reverse order.
fn reverse_rows(s: &str) -> String {
    let (Some(first), Some(end)) = (s.find("</th></tr>"), s.find("</table>")) else {
        return s.to_string();
    };
    let body_start = first + "</th></tr>".len();
    let rows: Vec<String> = s[body_start..end]
        .split_inclusive("</tr>")
        .map(str::to_string)
        .collect();
    let reversed: String = rows.into_iter().rev().collect();
    format!("{}{reversed}{}", &s[..body_start], &s[end..])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every perturbation changes the menu, the track link and the form, keeps the data, and is
    /// the same for the same seed.
    #[test]
    fn perturbs_deterministically() {
        let plain = crate::generate(7);
        for p in 0..8 {
            let moved = crate::generate_with(7, Some(p));
            assert_eq!(moved, crate::generate_with(7, Some(p)));
            let page = |k: &str| String::from_utf8(moved[k].clone()).unwrap();
            assert!(!page("/").contains(&nav_html(&NAV)), "seed {p}: menu unchanged");
            assert!(!page("/orders/A-1042").contains("Track this shipment"));
            assert!(!page("/shipping").contains("id=\"tracking\""));
            assert!(!page("/shipping").contains("id=\"go\""));
            assert!(page("/orders").contains("View A-1042"));
            let o = &crate::data(7).orders[2];
            let status = page(&format!("/shipping/{}", o.tracking));
            assert!(
                status.contains(&o.tracking),
                "seed {p}: the shipment page lost its data"
            );
            assert_ne!(moved["/"], plain["/"]);
        }
    }
}
