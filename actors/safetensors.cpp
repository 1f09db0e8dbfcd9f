#include "actors/safetensors.h"
