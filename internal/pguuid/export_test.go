package pguuid

// The codec's plan and type, for assertions that pgx picked them.
var (
	EncodePlanForTest = encodeBinary{}
	CodecForTest      = codec{}
)
