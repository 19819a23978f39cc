//! What a GGML element type is, apart from its bytes: the GGUF type ids sinter reads, ggml's
//! names for every id (supported or not, for error messages) and the error type of this
//! module. The block layouts and the sizes that follow from them are in `blocks`.

use std::fmt;

/// Elements in one block of the k-quants (`QK_K` in llama.cpp).
pub const QK_K: usize = 256;

/// What went wrong reading GGML data: the message says what and how to fix it; the caller
/// adds which file and tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GgmlError(pub String);

impl fmt::Display for GgmlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for GgmlError {}

/// The GGML element types sinter reads. The discriminant is the type id stored in GGUF files
/// (`enum ggml_type` in llama.cpp's ggml.h).
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum GgmlType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q2_K = 10,
    Q3_K = 11,
    Q4_K = 12,
    Q5_K = 13,
    Q6_K = 14,
    Q8_K = 15,
    BF16 = 30,
}

/// Every type id that ggml has defined, by name, so an unsupported one is refused by name.
const KNOWN_TYPE_NAMES: &[(u32, &str)] = &[
    (0, "F32"),
    (1, "F16"),
    (2, "Q4_0"),
    (3, "Q4_1"),
    (4, "Q4_2 (removed from ggml)"),
    (5, "Q4_3 (removed from ggml)"),
    (6, "Q5_0"),
    (7, "Q5_1"),
    (8, "Q8_0"),
    (9, "Q8_1"),
    (10, "Q2_K"),
    (11, "Q3_K"),
    (12, "Q4_K"),
    (13, "Q5_K"),
    (14, "Q6_K"),
    (15, "Q8_K"),
    (16, "IQ2_XXS"),
    (17, "IQ2_XS"),
    (18, "IQ3_XXS"),
    (19, "IQ1_S"),
    (20, "IQ4_NL"),
    (21, "IQ3_S"),
    (22, "IQ2_S"),
    (23, "IQ4_XS"),
    (24, "I8"),
    (25, "I16"),
    (26, "I32"),
    (27, "I64"),
    (28, "F64"),
    (29, "IQ1_M"),
    (30, "BF16"),
    (31, "Q4_0_4_4 (removed from ggml)"),
    (32, "Q4_0_4_8 (removed from ggml)"),
    (33, "Q4_0_8_8 (removed from ggml)"),
    (34, "TQ1_0"),
    (35, "TQ2_0"),
    (36, "IQ4_NL_4_4 (removed from ggml)"),
    (37, "IQ4_NL_4_8 (removed from ggml)"),
    (38, "IQ4_NL_8_8 (removed from ggml)"),
    (39, "MXFP4"),
    (40, "NVFP4"),
    (41, "Q1_0"),
];

/// The name ggml gives type id `id`, supported here or not.
pub fn ggml_type_name(id: u32) -> Option<&'static str> {
    KNOWN_TYPE_NAMES
        .iter()
        .find(|(i, _)| *i == id)
        .map(|(_, n)| *n)
}

impl GgmlType {
    pub const ALL: [GgmlType; 14] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q8_K,
    ];

    /// The type with GGUF type id `id`; an unsupported or unknown id is an error naming it.
    pub fn from_id(id: u32) -> Result<GgmlType, GgmlError> {
        if let Some(ty) = GgmlType::ALL.into_iter().find(|t| t.id() == id) {
            return Ok(ty);
        }
        let supported: Vec<&str> = GgmlType::ALL.iter().map(|t| t.name()).collect();
        Err(GgmlError(match ggml_type_name(id) {
            Some(name) => format!(
                "ggml type {id} ({name}) is not supported; sinter reads {} (re-quantize the model to one of them, e.g. with llama.cpp's llama-quantize)",
                supported.join(", ")
            ),
            None => format!(
                "ggml type id {id} is unknown (not a type ggml defines, so the file is corrupt or newer than sinter); sinter reads {}",
                supported.join(", ")
            ),
        }))
    }

    pub fn id(self) -> u32 {
        self as u32
    }

    /// ggml's name for the type ("Q4_K", "F16").
    pub fn name(self) -> &'static str {
        ggml_type_name(self.id()).expect("every supported type is named")
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
