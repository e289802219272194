//! kamera-site: the deterministic demo site (scenarios/site/) that Kamera's tests, the `kamera`
//! binary and the example apps in agents/ run against. Pages are generated from a seed (an order
//! portal with shipping status, a catalogue and cart, a directory, a returns form that takes an
//! attachment and CSV invoices to download); [`data`] is what they show,
//! so a test or an app can state the expected answer. Serve the pages on loopback with
//! `kamera_browser::Server::start(Content::Memory(kamera_site::generate(seed)))`.
//!
//! A test fixture (`publish = false`), kept out of kamera-agent's public surface.
//!
//! ```
//! let pages = kamera_site::generate(7);
//! let order = &kamera_site::data(7).orders[3];
//! assert_eq!(order.id, "A-1043");
//! let shipment = String::from_utf8(pages[&format!("/shipping/{}", order.tracking)].clone()).unwrap();
//! assert!(shipment.contains(&format!("Status: {}", order.status)));
//! assert!(kamera_site::STATUSES.contains(&order.status.as_str()));
//! ```

use std::collections::BTreeMap;

pub mod perturb;

const LAYOUT: &str = include_str!("../../../scenarios/site/layout.html");
const STYLE: &str = include_str!("../../../scenarios/site/style.css");

/// splitmix64: small, fast, and the same on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
        xs[self.below(xs.len())]
    }
}

/// The shipping statuses a tracking page can show.
pub const STATUSES: [&str; 5] = [
    "Delivered",
    "In transit",
    "Out for delivery",
    "Held at customs",
    "Awaiting pickup",
];
const CARRIERS: [&str; 4] = ["Northwind Freight", "Bluebird Post", "Cobalt Express", "Harbor Line"];
const HUBS: [&str; 5] = ["Rotterdam", "Leipzig", "Lyon", "Gdansk", "Porto"];
const ITEMS: [&str; 8] = [
    "desk lamp",
    "office chair",
    "label printer",
    "monitor arm",
    "paper shredder",
    "whiteboard",
    "bookshelf",
    "standing mat",
];
const CUSTOMERS: [&str; 6] = [
    "Ada Brandt",
    "Tomas Ek",
    "Mira Solberg",
    "Jon Halloran",
    "Ines Vidal",
    "Kai Mercer",
];
const TEAMS: [&str; 4] = ["Logistics", "Billing", "Support", "Platform"];
const PEOPLE: [&str; 6] = ["ada", "tomas", "mira", "jon", "ines", "kai"];

/// One order of the portal (exposed so that tests and scenarios can state expected answers).
#[derive(Debug, Clone, PartialEq)]
pub struct Order {
    pub id: String,
    pub customer: String,
    pub item: String,
    pub carrier: String,
    pub tracking: String,
    pub status: String,
    pub hub: String,
}

/// The site's data for `seed`.
#[derive(Debug, Clone)]
pub struct SiteData {
    pub orders: Vec<Order>,
}

/// The data behind the pages of `seed`.
pub fn data(seed: u64) -> SiteData {
    let mut r = Rng(seed ^ 0x6b61_6d65_7261);
    let orders = (0..6)
        .map(|i| Order {
            id: format!("A-{}", 1040 + i),
            customer: CUSTOMERS[i].to_string(),
            item: r.pick(&ITEMS).to_string(),
            carrier: r.pick(&CARRIERS).to_string(),
            tracking: format!("TRK-{}", 50000 + r.below(49999)),
            status: r.pick(&STATUSES).to_string(),
            hub: r.pick(&HUBS).to_string(),
        })
        .collect();
    SiteData { orders }
}

fn page(title: &str, body: &str) -> Vec<u8> {
    LAYOUT
        .replace("{{title}}", title)
        .replace("{{body}}", body)
        .into_bytes()
}

/// Every page of the site for `seed`, by path.
pub fn generate(seed: u64) -> BTreeMap<String, Vec<u8>> {
    generate_with(seed, None)
}

/// The site for `seed`, with its layout perturbed by `perturb` when given ([`perturb`]): the same
/// data and paths, the pages rearranged as a redesign would.
pub fn generate_with(seed: u64, perturb: Option<u64>) -> BTreeMap<String, Vec<u8>> {
    let mut m = generate_plain(seed);
    if let Some(p) = perturb {
        perturb::apply(&mut m, p);
    }
    m
}

// Long: builds every page of the plain site into one map, section by section.
fn generate_plain(seed: u64) -> BTreeMap<String, Vec<u8>> {
    let d = data(seed);
    let mut r = Rng(seed ^ 0x7369_7465);
    let mut m = BTreeMap::new();
    m.insert("/style.css".to_string(), STYLE.as_bytes().to_vec());
    m.insert(
        "/".to_string(),
        page(
            "Kestrel Supply",
            "<p>Customer portal. Use the menu to find orders, track shipments, browse the catalogue or \
             look people up.</p><p><a href=\"/leave\">Partner sites</a></p>",
        ),
    );
    m.insert(
        "/leave".to_string(),
        page(
            "Partner sites",
            "<p><a id=\"partner\" href=\"http://partner.invalid/\">Our partner</a></p>",
        ),
    );

    // Order portal + shipping status.
    let mut rows = String::from("<table><tr><th>Order</th><th>Customer</th><th>Item</th><th></th></tr>");
    for o in &d.orders {
        rows += &format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td><a href=\"/orders/{}\">View {}</a></td></tr>",
            o.id, o.customer, o.item, o.id, o.id
        );
    }
    rows += "</table>";
    m.insert("/orders".to_string(), page("Orders", &rows));
    for o in &d.orders {
        m.insert(
            format!("/orders/{}", o.id),
            page(
                &format!("Order {}", o.id),
                &format!(
                    "<p class=\"fact\">Customer: {}</p><p class=\"fact\">Item: {}</p>\
                     <p class=\"fact\">Carrier: {}</p><p class=\"fact\">Tracking number: {}</p>\
                     <p><a href=\"/shipping\">Track this shipment</a></p>",
                    o.customer, o.item, o.carrier, o.tracking
                ),
            ),
        );
        m.insert(
            format!("/shipping/{}", o.tracking),
            page(
                &format!("Shipment {}", o.tracking),
                &format!(
                    "<p class=\"fact\">Tracking number: {}</p><p class=\"fact\">Status: {}</p>\
                     <p class=\"fact\">Last hub: {}</p>",
                    o.tracking, o.status, o.hub
                ),
            ),
        );
    }
    m.insert(
        "/shipping".to_string(),
        page(
            "Shipping status",
            "<form id=\"track\" onsubmit=\"location.href='/shipping/' + encodeURIComponent(document.getElementById('tracking').value.trim()); return false;\">\
             <input id=\"tracking\" placeholder=\"Tracking number\"> <button id=\"go\" type=\"submit\">Track</button></form>",
        ),
    );

    // Catalogue + cart.
    let mut cat = String::from("<table><tr><th>SKU</th><th>Product</th><th></th></tr>");
    let mut cart = String::from("<table><tr><th>SKU</th><th>Quantity</th></tr>");
    for (i, item) in ITEMS.iter().enumerate() {
        let sku = format!("P-{}", 200 + i);
        let price = 12 + r.below(180);
        let stock = r.below(40);
        cat += &format!("<tr><td>{sku}</td><td>{item}</td><td><a href=\"/product/{sku}\">Open {sku}</a></td></tr>");
        if i % 3 == 0 {
            cart += &format!("<tr><td>{sku}</td><td>{}</td></tr>", 1 + r.below(4));
        }
        m.insert(
            format!("/product/{sku}"),
            page(
                &format!("Product {sku}"),
                &format!(
                    "<p class=\"fact\">Name: {item}</p><p class=\"fact\">Price: {price} EUR</p>\
                     <p class=\"fact\">In stock: {stock}</p>"
                ),
            ),
        );
    }
    m.insert(
        "/catalogue".to_string(),
        page("Catalogue", &(cat + "</table><p><a href=\"/cart\">Cart</a></p>")),
    );
    m.insert("/cart".to_string(), page("Cart", &(cart + "</table>")));

    // Profile + directory.
    let mut people = String::from("<ul>");
    let mut teams: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (i, p) in PEOPLE.iter().enumerate() {
        let team = r.pick(&TEAMS);
        teams.entry(team).or_default().push(CUSTOMERS[i]);
        people += &format!("<li><a href=\"/people/{p}\">{}</a></li>", CUSTOMERS[i]);
        m.insert(
            format!("/people/{p}"),
            page(
                CUSTOMERS[i],
                &format!(
                    "<p class=\"fact\">Team: <a href=\"/teams/{}\">{team}</a></p><p class=\"fact\">Extension: {}</p>",
                    team.to_lowercase(),
                    100 + r.below(800)
                ),
            ),
        );
    }
    m.insert("/people".to_string(), page("Directory", &(people + "</ul>")));
    for t in TEAMS {
        let members = teams.get(t).map(|v| v.join(", ")).unwrap_or_default();
        m.insert(
            format!("/teams/{}", t.to_lowercase()),
            page(
                &format!("Team {t}"),
                &format!(
                    "<p class=\"fact\">Floor: {}</p><p class=\"fact\">Members: {members}</p>",
                    1 + r.below(9)
                ),
            ),
        );
    }
    files(&d, &mut m);
    m
}

/// The invoice of `order` as the site serves it for download (`/invoices/<id>.csv`).
pub fn invoice_csv(order: &Order) -> String {
    format!(
        "order,customer,item,carrier,tracking\n{},{},{},{},{}\n",
        order.id, order.customer, order.item, order.carrier, order.tracking
    )
}

/// The pages with files: a returns form that takes an attachment (posted to
/// `/returns/submit`, where the loopback server answers what it received) and the invoices,
/// each a CSV download. Reached by URL (the menu is as it was).
fn files(d: &SiteData, m: &mut BTreeMap<String, Vec<u8>>) {
    m.insert(
        "/returns".to_string(),
        page(
            "Returns",
            "<form id=\"return\" method=\"post\" enctype=\"multipart/form-data\" action=\"/returns/submit\">\
             <p><label>Order <input id=\"return-order\" name=\"order\" placeholder=\"Order number\"></label></p>\
             <p><label>Photo or receipt <input type=\"file\" id=\"attachment\" name=\"attachment\"></label></p>\
             <p><button id=\"send-return\" type=\"submit\">Send return request</button></p></form>",
        ),
    );
    let mut list = String::from("<ul>");
    for o in &d.orders {
        list += &format!(
            "<li><a href=\"/invoices/{id}.csv\" download>Invoice {id} (CSV)</a></li>",
            id = o.id
        );
        m.insert(format!("/invoices/{}.csv", o.id), invoice_csv(o).into_bytes());
    }
    m.insert("/invoices".to_string(), page("Invoices", &(list + "</ul>")));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic() {
        assert_eq!(generate(7), generate(7));
        assert_ne!(generate(7), generate(8));
        let d = data(7);
        let o = &d.orders[2];
        let text = String::from_utf8(generate(7)[&format!("/shipping/{}", o.tracking)].clone()).unwrap();
        assert!(text.contains(&o.status));
        assert_eq!(generate_with(7, None), generate(7));
    }

    #[test]
    fn returns_form_and_invoices() {
        let site = generate(7);
        let returns = String::from_utf8(site["/returns"].clone()).unwrap();
        assert!(returns.contains("enctype=\"multipart/form-data\"") && returns.contains("type=\"file\""));
        let o = &data(7).orders[1];
        assert_eq!(site[&format!("/invoices/{}.csv", o.id)], invoice_csv(o).into_bytes());
        let list = String::from_utf8(site["/invoices"].clone()).unwrap();
        assert!(list.contains(&format!("href=\"/invoices/{}.csv\" download", o.id)));
    }
}
