// Put first on the include path of a consumer that must build on a machine
// without xxHash: any #include <xxhash.h> reached from what it includes fails.
#error "xxhash.h was included, but this consumer uses only headers that must not need xxHash"
