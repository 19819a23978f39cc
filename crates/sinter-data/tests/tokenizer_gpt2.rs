//! GPT-2 tokeniser: known ids, round trips, and the chunked encoding used by `sinter tokenize`.

use sinter_data::Gpt2Tokenizer;

#[test]
fn known_encodings_match_gpt2() {
    let tok = Gpt2Tokenizer::new();
    assert_eq!(tok.encode("Hello world"), vec![15496, 995]);
    assert_eq!(
        tok.encode("The quick brown fox"),
        vec![464, 2068, 7586, 21831]
    );
    assert_eq!(tok.encode("\n"), vec![198]);
    assert_eq!(tok.encode("\n\n"), vec![628]);
    assert_eq!(tok.encode(""), Vec::<u16>::new());
    // Special tokens are ordinary text unless asked for.
    assert_eq!(
        tok.encode_with_special("<|endoftext|>"),
        vec![Gpt2Tokenizer::EOT]
    );
    assert!(tok.encode("<|endoftext|>").len() > 1);
    assert_eq!(Gpt2Tokenizer::EOT, 50256);
}

#[test]
fn decode_inverts_encode() {
    let tok = Gpt2Tokenizer::new();
    for s in [
        "Hello world",
        "  leading spaces,\ttabs\nand lines\n\n",
        "naïve café — ünïcödé 日本語 🎉",
        "x = 3.14159; y'all can't",
        "",
    ] {
        let ids = tok.encode(s);
        assert!(ids
            .iter()
            .all(|&t| (t as usize) < Gpt2Tokenizer::VOCAB_SIZE));
        assert_eq!(tok.decode(&ids), s, "ids {ids:?}");
        assert_eq!(tok.decode_bytes(&ids).unwrap(), s.as_bytes());
    }
    assert_eq!(
        tok.decode(&[15496, Gpt2Tokenizer::EOT]),
        "Hello<|endoftext|>"
    );
}

#[test]
fn ids_outside_the_vocabulary_are_reported() {
    let tok = Gpt2Tokenizer::new();
    let err = tok.decode_bytes(&[15496, 60000]).unwrap_err().to_string();
    assert!(err.contains("60000") && err.contains("position 1"), "{err}");
    assert_eq!(tok.decode(&[15496, 60000]), "Hello\u{FFFD}");
}

#[test]
fn split_pieces_encode_exactly_like_the_whole_text() {
    let tok = Gpt2Tokenizer::new();
    let text = include_str!("../../../data/tinyshakespeare.txt");
    let text = &text[..200_000];
    let pieces = Gpt2Tokenizer::split_for_encoding(text, 4096);
    assert!(pieces.len() > 20, "{} pieces", pieces.len());
    assert_eq!(pieces.concat(), text);
    let joined: Vec<u16> = pieces.iter().flat_map(|p| tok.encode(p)).collect();
    let whole = tok.encode(text);
    let first_diff = joined.iter().zip(&whole).position(|(a, b)| a != b);
    assert!(
        joined.len() == whole.len() && first_diff.is_none(),
        "lengths {} vs {}, first difference at {first_diff:?}",
        joined.len(),
        whole.len()
    );
    // Tricky whitespace around the cut places.
    let tricky = "a\n\n b\n \nc\n\td \n\ne\r\nf\n\u{a0}g\nh.\n\nI'm\n's\n  \n9\n";
    for n in 1..tricky.len() {
        let pieces = Gpt2Tokenizer::split_for_encoding(tricky, n);
        assert_eq!(pieces.concat(), tricky);
        let joined: Vec<u16> = pieces.iter().flat_map(|p| tok.encode(p)).collect();
        assert_eq!(joined, tok.encode(tricky), "approx {n}: {pieces:?}");
    }
    assert_eq!(
        Gpt2Tokenizer::split_for_encoding("", 10),
        Vec::<&str>::new()
    );
    assert_eq!(
        Gpt2Tokenizer::split_for_encoding("one line", 1),
        vec!["one line"]
    );
}
