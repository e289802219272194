//! A deterministic generator of web-page-like multi-hop tasks: the answer is a fact of one page
//! (the "fact" page) about an entity that only another page (the "bridge" page) ties to the
//! question's subject; distractor pages state the same kind of fact about other entities.
//! Pages carry navigation, breadcrumbs, filler paragraphs and footers like real pages.

use serde::{Deserialize, Serialize};

use crate::task::Task;

/// Generator settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenConfig {
    pub seed: u64,
    pub tasks: usize,
    /// Pages per task: the bridge page, the fact page and `pages - 2` distractors (>= 2).
    pub pages: usize,
    /// Filler sentences per page (about 15 tokens each); 0 gives short pages for tests.
    pub filler: usize,
}

impl Default for GenConfig {
    fn default() -> GenConfig {
        GenConfig {
            seed: 7,
            tasks: 120,
            pages: 3,
            filler: 12,
        }
    }
}

/// SplitMix64: small, fast and the same on every platform.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
    pub fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
        xs[self.below(xs.len())]
    }
    pub fn shuffle<T>(&mut self, xs: &mut [T]) {
        for i in (1..xs.len()).rev() {
            xs.swap(i, self.below(i + 1));
        }
    }
    /// `k` distinct items of `xs`.
    pub fn distinct<'a>(&mut self, xs: &[&'a str], k: usize) -> Vec<&'a str> {
        let mut v = xs.to_vec();
        self.shuffle(&mut v);
        v.truncate(k);
        v
    }
}

const CITIES: &[&str] = &[
    "Oslo",
    "Lisbon",
    "Denver",
    "Nairobi",
    "Osaka",
    "Toronto",
    "Madrid",
    "Dublin",
    "Seattle",
    "Vienna",
    "Helsinki",
    "Prague",
    "Austin",
    "Lagos",
    "Sydney",
    "Boston",
    "Munich",
    "Chicago",
    "Warsaw",
    "Athens",
    "Cairo",
    "Lima",
    "Montreal",
    "Stockholm",
    "Budapest",
    "Phoenix",
    "Manila",
    "Bogota",
    "Geneva",
    "Atlanta",
];
const FIRST: &[&str] = &[
    "Dana", "Marcus", "Elena", "Tobias", "Priya", "Jonas", "Amara", "Felix", "Ingrid", "Rafael", "Yuki", "Nadia",
    "Oliver", "Leila", "Victor", "Hannah", "Mateo", "Sofia", "Kwame", "Clara",
];
const LAST: &[&str] = &[
    "Whitfield",
    "Okafor",
    "Lindqvist",
    "Moreau",
    "Tanaka",
    "Brennan",
    "Castillo",
    "Novak",
    "Haddad",
    "Sorensen",
    "Kowalski",
    "Ferreira",
    "Ibarra",
    "Nakamura",
    "Adeyemi",
    "Holloway",
    "Petrov",
    "Quinn",
    "Delacroix",
    "Varga",
];
const SYL: &[&str] = &[
    "Kor", "vex", "Lum", "ora", "Tri", "dent", "Zen", "ith", "Nova", "line", "Quar", "tz", "Hal", "cyon", "Vel", "ta",
    "Ori", "on", "Pax", "ium", "Sol", "ara", "Bri", "ght",
];
const SUFFIX: &[&str] = &[
    "Labs",
    "Systems",
    "Works",
    "Dynamics",
    "Group",
    "Industries",
    "Partners",
    "Studio",
];
const ADJ: &[&str] = &[
    "Aurora", "Summit", "Cobalt", "Ember", "Granite", "Harbor", "Juniper", "Lumen", "Maple", "Nimbus", "Onyx",
    "Pioneer", "Quartz", "Sierra", "Tundra", "Velvet",
];
const PRODUCT: &[&str] = &[
    "desk lamp",
    "espresso grinder",
    "trail backpack",
    "standing desk",
    "noise-cancelling headset",
    "cast iron skillet",
    "road bike helmet",
    "mechanical keyboard",
    "air purifier",
    "camping stove",
];
const EVENT: &[&str] = &[
    "Spring Gala",
    "Robotics Summit",
    "Jazz Night",
    "Founders Forum",
    "Winter Book Fair",
    "Data Science Meetup",
    "Film Festival",
    "Charity Run",
];
const VENUE: &[&str] = &["Hall", "Pavilion", "Arena", "Theater", "Conference Center", "Gardens"];
const FILLER: &[&str] = &[
    "Sign up for our newsletter to receive weekly updates, exclusive offers and early access to new releases.",
    "Our support team is available Monday through Friday from nine in the morning until six in the evening.",
    "Customers who viewed this page also looked at several related items in the same category.",
    "Free shipping applies to all orders above fifty dollars within the continental region.",
    "We use cookies to improve your browsing experience and to analyze traffic on this website.",
    "Read the reviews below to learn what other visitors think about their experience with us.",
    "All prices include applicable taxes unless otherwise stated at checkout.",
    "Follow us on social media for behind-the-scenes stories and community highlights.",
    "This page was last updated recently and reflects the most current information available.",
    "Returns are accepted within thirty days of delivery if the item is unused and in its original packaging.",
    "Gift cards can be redeemed online or in person and never expire.",
    "Accessibility is important to us, so please contact us if any part of this site is hard to use.",
    "Our team has spent years refining every detail so that you can focus on what matters most.",
    "Browse the full catalog using the filters on the left side of the page.",
    "Frequently asked questions are answered in the help center, which is updated every week.",
    "Members receive priority booking, discounted tickets and invitations to special events.",
    "Photos on this page are for illustration purposes and may differ slightly from the actual item.",
    "Please allow two to four business days for processing before your order is dispatched.",
    "Share this page with friends and colleagues who might find it useful.",
    "The opinions expressed in community posts belong to their authors and not to the editors.",
];

fn company(rng: &mut Rng) -> String {
    let a = rng.below(SYL.len() / 2) * 2;
    let b = rng.below(SYL.len() / 2) * 2 + 1;
    format!("{}{} {}", SYL[a], SYL[b], rng.pick(SUFFIX))
}

fn person(rng: &mut Rng) -> String {
    format!("{} {}", rng.pick(FIRST), rng.pick(LAST))
}

fn slug(s: &str) -> String {
    s.to_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect()
}

/// A page: url line, navigation, breadcrumbs, title, filler around `body`, footer.
fn page(rng: &mut Rng, cfg: &GenConfig, site: &str, path: &str, title: &str, body: &[String]) -> String {
    let mut s = format!(
        "\n=== Page: https://www.{}.com/{} ===\n[Home] [Products] [About] [Careers] [Contact]\nHome > {}\n# {}\n",
        slug(site),
        path,
        title,
        title
    );
    let mut paras: Vec<String> = rng
        .distinct(FILLER, cfg.filler)
        .into_iter()
        .map(str::to_string)
        .collect();
    while paras.len() < cfg.filler {
        paras.push(rng.pick(FILLER).to_string());
    }
    for (i, b) in body.iter().enumerate() {
        let at = if paras.is_empty() {
            0
        } else {
            (i * 2 + rng.below(2)).min(paras.len())
        };
        paras.insert(at, b.clone());
    }
    for p in paras {
        s.push_str(&p);
        s.push('\n');
    }
    s.push_str(&format!("(c) 2025 {site}. All rights reserved. | Privacy | Terms\n"));
    s
}

/// One task of template `kind` (0: product -> seller -> city, 1: person -> employer ->
/// headquarters, 2: event -> venue -> city).
// Long: one arm per two-hop template, each writing its pages and question.
fn task(rng: &mut Rng, cfg: &GenConfig, index: usize, kind: usize) -> Task {
    let n_facts = cfg.pages.max(2) - 1;
    let cities = rng.distinct(CITIES, n_facts);
    let mut pages = Vec::new();
    let (question, answer);
    match kind {
        0 => {
            let product = format!("{} {}", rng.pick(ADJ), rng.pick(PRODUCT));
            let sellers: Vec<String> = (0..n_facts).map(|_| company(rng)).collect();
            let shop = format!("{} Market", rng.pick(ADJ));
            let body = vec![
                format!("The {product} is sold and shipped by {}.", sellers[0]),
                format!("Rated 4.{} out of 5 by verified buyers.", rng.below(10)),
            ];
            pages.push(page(
                rng,
                cfg,
                &shop,
                &format!("item/{}", slug(&product)),
                &product,
                &body,
            ));
            for (s, c) in sellers.iter().zip(&cities) {
                let body = vec![
                    format!("{s} is an independent seller. All orders from {s} ship from our warehouse in {c}."),
                    format!("{s} has been trading online since 20{:02}.", rng.below(20)),
                ];
                pages.push(page(rng, cfg, s, "about", &format!("About {s}"), &body));
            }
            question = format!(
                "\nQuestion: From which city does the seller of the {product} ship its orders?\nAnswer: The orders ship from"
            );
            answer = format!(" {}.", cities[0]);
        }
        1 => {
            let who = person(rng);
            let companies: Vec<String> = (0..n_facts).map(|_| company(rng)).collect();
            let body = vec![
                format!("{who} is a senior engineer at {}.", companies[0]),
                format!("{who} studied physics and enjoys hiking on weekends."),
            ];
            pages.push(page(rng, cfg, "ProfileHub", &format!("in/{}", slug(&who)), &who, &body));
            for (c, city) in companies.iter().zip(&cities) {
                let body = vec![
                    format!("{c} is headquartered in {city}, where most of its staff work."),
                    format!("{c} builds software for logistics companies."),
                ];
                pages.push(page(rng, cfg, c, "company", &format!("{c} - Company overview"), &body));
            }
            question = format!(
                "\nQuestion: In which city is the headquarters of the company where {who} works?\nAnswer: The headquarters are in"
            );
            answer = format!(" {}.", cities[0]);
        }
        _ => {
            let event = format!("{} {}", rng.pick(ADJ), rng.pick(EVENT));
            let venues: Vec<String> = (0..n_facts)
                .map(|_| format!("{} {}", rng.pick(LAST), rng.pick(VENUE)))
                .collect();
            let body = vec![
                format!("The {event} will be held at the {} this year.", venues[0]),
                format!(
                    "Doors open at {} pm and tickets are available online.",
                    5 + rng.below(4)
                ),
            ];
            pages.push(page(
                rng,
                cfg,
                "CityEvents",
                &format!("events/{}", slug(&event)),
                &event,
                &body,
            ));
            for (v, city) in venues.iter().zip(&cities) {
                let body = vec![
                    format!("The {v} is located in downtown {city}, close to the central station."),
                    format!("The {v} seats up to {} guests.", 200 + 50 * rng.below(20)),
                ];
                pages.push(page(rng, cfg, v, "visit", &format!("Visit the {v}"), &body));
            }
            question = format!("\nQuestion: In which city will the {event} take place?\nAnswer: It will take place in");
            answer = format!(" {}.", cities[0]);
        }
    }
    // The bridge page stays before its fact page (the conditioning the question needs);
    // distractors go anywhere.
    let mut order: Vec<usize> = (0..pages.len()).collect();
    rng.shuffle(&mut order);
    let (bi, fi) = (
        order.iter().position(|&p| p == 0).unwrap_or(0),
        order.iter().position(|&p| p == 1).unwrap_or(0),
    );
    if bi > fi {
        order.swap(bi, fi);
    }
    Task {
        id: format!("{}-{index:04}", ["seller", "employer", "venue"][kind]),
        chunks: order.into_iter().map(|i| pages[i].clone()).collect(),
        question,
        answer,
    }
}

/// `cfg.tasks` tasks cycling through the templates; the same config gives the same tasks.
pub fn generate(cfg: &GenConfig) -> Vec<Task> {
    let mut rng = Rng::new(cfg.seed);
    (0..cfg.tasks).map(|i| task(&mut rng, cfg, i, i % 3)).collect()
}

/// Text of about `tokens`-ish length (filler pages) for benchmarks; `seed` varies the text.
pub fn filler_text(seed: u64, sentences: usize) -> String {
    let mut rng = Rng::new(seed);
    let cfg = GenConfig {
        seed,
        tasks: 1,
        pages: 2,
        filler: sentences,
    };
    let site = company(&mut rng);
    page(&mut rng, &cfg, &site, "page", &site, &[])
}
